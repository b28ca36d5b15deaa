package sweeper_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/sweeper"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// A claim of queued payments that commits while its answer is lost leaves them leased to a
// drainer that does not know it took them: its next claim must not take the merchant's later
// payments ahead of them. They start once their lease runs out, in arrival order, each once.
func TestDrainerClaimWhoseAnswerWasLost(t *testing.T) {
	cutter, cut := cutStore(t)

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
	cutter, cut := cutStore(t)

	m := orderMerchant(t, "stopped-claim")
	keys := queue(t, m, "stopped-claim", 4)
	ended, release := cutter.HoldAnswerOf("-- name: ClaimQueued")
	defer release()
	stopped := newCluster(10 * time.Millisecond)
	<-stopWhileHeld(t, ended, release, (&sweeper.Drainer{Store: cut, Starter: stopped, MaxRunning: 2, Lease: time.Minute}).Run)
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

// A sweeper stopped while its takeover of a stranded payment runs (committed in the database, its
// answer not yet read) gives the record's lease back: the client's retry, or another sweeper,
// takes it over at once rather than after the lease.
func TestSweeperStoppedMidTakeOverGivesTheLeaseBack(t *testing.T) {
	ctx := context.Background()
	cutter, cut := cutStore(t)

	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Deposit: 100_000})
	const key = "stopped-takeover"
	_, _, _, err := db.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, OperationID: payment.NewID(), Lease: time.Millisecond,
		Request: payment.Request{InvoiceID: "inv-stopped-takeover", AmountMinor: 500, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}})
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)

	ended, release := cutter.HoldAnswerOf("-- name: TakeOver :one")
	defer release()
	st := &starts{payments: map[string]workflows.PaymentInput{}, refunds: map[string]workflows.RefundInput{}}
	sw := &sweeper.Sweeper{Store: cut, Starter: st, Lease: time.Minute, Merchant: &m.ID}
	<-stopWhileHeld(t, ended, release, func(ctx context.Context) { _, _ = sw.Sweep(ctx) })

	rec, err := db.Record(ctx, m.ID, key)
	require.NoError(t, err)
	require.False(t, rec.LockedUntil.After(time.Now()), "the record is not left leased to the stopped sweeper (until %s)", rec.LockedUntil)
	won, err := db.TakeOver(ctx, m.ID, key, time.Minute)
	require.NoError(t, err)
	require.True(t, won, "a retry takes it over at once")
}

// A drainer stopped mid-claim whose putting back then meets a stalled database still stops
// within a bounded time: an API's shutdown does not wait on it for ever (the payments' leases
// then run out as after a crash).
func TestDrainerStoppedMidClaimStopsWhenTheDatabaseStalls(t *testing.T) {
	cutter, cut := cutStore(t)

	m := orderMerchant(t, "stalled-unclaim")
	keys := queue(t, m, "stalled-unclaim", 2)
	claimed, releaseClaim := cutter.HoldAnswerOf("-- name: ClaimQueued")
	defer releaseClaim()
	_, releaseUnclaim := cutter.HoldAnswerOf("-- name: Unclaim")
	defer releaseUnclaim()
	done := stopWhileHeld(t, claimed, releaseClaim,
		(&sweeper.Drainer{Store: cut, Starter: newCluster(10 * time.Millisecond), MaxRunning: 2, Lease: time.Second}).Run)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the stopped drainer still waits on the stalled database after 20 s")
	}
	releaseUnclaim()
	c := newCluster(10 * time.Millisecond)
	drain(t, &sweeper.Drainer{Store: db, Starter: c, MaxRunning: 2, Lease: time.Second}, c, keys)
}

// cutStore is a store whose connections pass through a commit cutter.
func cutStore(t *testing.T) (*testkit.CommitCutter, *store.Store) {
	t.Helper()
	cutter := testkit.NewCommitCutter(t, dbURL)
	cut, err := store.Open(context.Background(), store.Options{URL: cutter.URL, SecretKey: testkit.SecretKey})
	require.NoError(t, err)
	t.Cleanup(cut.Close)
	return cutter, cut
}

// stopWhileHeld runs run until its transaction whose answer the cutter holds has ended in the
// database (ended), stops it, and hands it the answer once the stop has reached it: done is
// closed when run returns.
func stopWhileHeld(t *testing.T, ended <-chan struct{}, release func(), run func(context.Context)) (done <-chan struct{}) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		run(ctx)
	}()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the held statement never ran")
	}
	stop()
	time.Sleep(200 * time.Millisecond) // the stop reaches the call still waiting for its answer
	release()
	return finished
}

// stallStarter is a cluster on which the first start of key fails for want of Temporal, and the
// merchant's claimed records are then held locked (the database stalled) until the drainer's
// putting them back gave up: they stay leased to it.
type stallStarter struct {
	*cluster
	key    string
	lock   func()
	failed atomic.Bool
}

func (s *stallStarter) StartPayment(ctx context.Context, key string, in workflows.PaymentInput) (string, error) {
	if key == s.key && s.failed.CompareAndSwap(false, true) {
		s.lock()
		return "", serviceerror.NewUnavailable("temporal: unavailable")
	}
	return s.cluster.StartPayment(ctx, key, in)
}

// A start that fails puts the merchant's claimed payments back in its queue; should that putting
// back fail (the database stalled past its bound), they stay leased to the drainer: its next
// claim must not take the merchant's later payments ahead of them. They start once their lease
// runs out, in arrival order, each once.
func TestDrainerWhosePutBackFailedKeepsTheMerchantsOrder(t *testing.T) {
	ctx := context.Background()
	m := orderMerchant(t, "stalled-putback")
	keys := queue(t, m, "stalled-putback", 6)
	locker, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer locker.Close(ctx)
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	locked := make(chan struct{})
	c := newCluster(10 * time.Millisecond)
	s := &stallStarter{cluster: c, key: keys[0], lock: func() {
		// The claim (one statement) committed: the claimed records are leased, and now locked.
		_, err := tx.Exec(ctx, `SELECT 1 FROM idempotency_records WHERE merchant_id = $1 AND queued FOR UPDATE`, m.ID)
		if err != nil {
			panic(err)
		}
		close(locked)
	}}
	watcher, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer watcher.Close(ctx)
	watched := make(chan struct{})
	go func() {
		// Once the putting back waited on the lock and gave up, the database answers again.
		defer close(watched)
		<-locked
		waiting := func() bool {
			var n int
			err := watcher.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE query LIKE '%name: Unclaim%' AND state = 'active' AND wait_event_type = 'Lock'`).Scan(&n)
			return err == nil && n > 0
		}
		for !waiting() {
			time.Sleep(10 * time.Millisecond)
		}
		for waiting() {
			time.Sleep(10 * time.Millisecond)
		}
		_ = tx.Rollback(ctx)
	}()
	defer func() { <-watched }()
	drain(t, &sweeper.Drainer{Store: db, Starter: s, MaxRunning: 4, Lease: 15 * time.Second}, c, keys)
	order, starts, _ := c.snapshot()
	for _, k := range keys {
		require.Equal(t, 1, starts[k], "%s started once", k)
	}
	require.Equal(t, keys, order, "the merchant's payments start in arrival order")
}
