package sweeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/sweeper"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// A claim of queued payments that commits while its answer is lost leaves them leased to a
// drainer that does not know it took them: its next claim must not take the merchant's later
// payments ahead of them. They start once their lease runs out, in arrival order, each once.
func TestDrainerClaimWhoseAnswerWasLost(t *testing.T) {
	cutter := testkit.NewCommitCutter(t, dbURL)
	cut, err := store.Open(context.Background(), store.Options{URL: cutter.URL, SecretKey: testkit.SecretKey})
	require.NoError(t, err)
	t.Cleanup(cut.Close)

	m := orderMerchant(t, "lost-claim")
	keys := queue(t, m, "lost-claim", 6)
	cutter.LoseCommitOf("-- name: ClaimQueued")
	c := newCluster(10 * time.Millisecond)
	drain(t, &sweeper.Drainer{Store: cut, Starter: c, MaxRunning: 2, Lease: 2 * time.Second}, c, keys)
	require.Equal(t, 1, cutter.Cut(), "the first claim's answer was lost")
	order, starts, _ := c.snapshot()
	for _, k := range keys {
		require.Equal(t, 1, starts[k], "%s started once", k)
	}
	require.Equal(t, keys, order, "the merchant's payments start in arrival order")
}

// A drainer stopped while its claim of queued payments runs (the claim committed in the
// database, its answer not yet read) puts what it claimed back in the queue, starting none: the
// next leader starts them at once, in arrival order, rather than after their leases.
func TestDrainerStoppedMidClaimPutsThePaymentsBack(t *testing.T) {
	ctx := context.Background()
	cutter := testkit.NewCommitCutter(t, dbURL)
	cut, err := store.Open(ctx, store.Options{URL: cutter.URL, SecretKey: testkit.SecretKey})
	require.NoError(t, err)
	t.Cleanup(cut.Close)

	m := orderMerchant(t, "stopped-claim")
	keys := queue(t, m, "stopped-claim", 4)
	ended, release := cutter.HoldAnswerOf("-- name: ClaimQueued")
	defer release()
	stopped := newCluster(10 * time.Millisecond)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		(&sweeper.Drainer{Store: cut, Starter: stopped, MaxRunning: 2, Lease: time.Minute}).Run(rctx)
	}()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the drainer never claimed")
	}
	stop()
	time.Sleep(200 * time.Millisecond) // the stop reaches the claim still waiting for its answer
	release()
	<-done
	_, starts, _ := stopped.snapshot()
	require.Empty(t, starts, "a stopping drainer starts nothing")
	leased, err := db.QueuedLeased(ctx)
	require.NoError(t, err)
	require.False(t, leased, "nothing is left leased to the stopped drainer")

	c := newCluster(10 * time.Millisecond)
	began := time.Now()
	drain(t, &sweeper.Drainer{Store: db, Starter: c, MaxRunning: 2, Lease: time.Minute}, c, keys)
	require.Less(t, time.Since(began), 20*time.Second, "not after the minute's lease")
	order, _, _ := c.snapshot()
	require.Equal(t, keys, order, "the merchant's payments start in arrival order, each once")
}
