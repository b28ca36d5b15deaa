package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
)

// Workers on one task queue share one policy: a worker whose settings differ from a live
// worker's is refused with both named; the same settings, another queue, or a worker long gone
// are no conflict. Imports wait out the longest booking window any worker reported.
func TestClaimWorkerPolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	queue := "q-" + uuid.NewString()
	none := store.WorkerPolicy{Capability: "none", BookingWindow: 77 * time.Hour, ChargeBudget: 2 * time.Minute, ChargeTimeout: 30 * time.Second}
	idem := none
	idem.Capability = "idempotent"

	require.NoError(t, db.ClaimWorkerPolicy(ctx, queue, none, time.Minute))
	require.NoError(t, db.ClaimWorkerPolicy(ctx, queue, none, time.Minute), "a second worker with the same settings")
	err := db.ClaimWorkerPolicy(ctx, queue, idem, time.Minute)
	var conflict *store.PolicyConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, none, conflict.Other)
	require.Contains(t, err.Error(), "capability none")
	require.Contains(t, err.Error(), "capability idempotent")
	require.NoError(t, db.ClaimWorkerPolicy(ctx, "other-"+queue, idem, time.Minute), "another queue")

	require.NoError(t, db.Exec(ctx, `UPDATE worker_policies SET last_seen = now() - interval '2 minutes' WHERE task_queue = $1`, queue))
	require.NoError(t, db.ClaimWorkerPolicy(ctx, queue, idem, time.Minute), "the none workers are gone")

	w, err := db.LongestBookingWindow(ctx, time.Hour)
	require.NoError(t, err)
	require.GreaterOrEqual(t, w, 77*time.Hour)
}

// Workers that start at the same moment with different settings: one policy wins the queue,
// and every worker whose settings differ from it is refused.
func TestClaimWorkerPolicyConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for round := range 20 {
		queue := fmt.Sprintf("race-%d-%s", round, uuid.NewString())
		start := make(chan struct{})
		claimed := make(chan string, 8)
		var wg sync.WaitGroup
		for i := range 8 {
			p := store.WorkerPolicy{Capability: []string{"none", "idempotent"}[i%2], ChargeBudget: time.Minute}
			wg.Go(func() {
				<-start
				err := db.ClaimWorkerPolicy(ctx, queue, p, time.Minute)
				var conflict *store.PolicyConflictError
				if !errors.As(err, &conflict) {
					require.NoError(t, err)
					claimed <- p.Capability
				}
			})
		}
		close(start)
		wg.Wait()
		close(claimed)
		won := map[string]bool{}
		for c := range claimed {
			won[c] = true
		}
		require.Len(t, won, 1, "round %d: workers with different settings both claimed the queue", round)
	}
}
