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
