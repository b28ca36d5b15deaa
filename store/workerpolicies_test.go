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
// worker's is refused with both named; so is one whose settings differ from the last reported,
// unless it changes them on purpose (only while no worker with others is live); the same
// settings or another queue are no conflict. Imports wait out the longest booking window any
// worker reported.
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

	// The none workers report no more (stopped, or stalled: no one can tell): the deployment's
	// settings are still theirs until a worker changes them on purpose.
	require.NoError(t, db.Exec(ctx, `UPDATE worker_policies SET last_seen = now() - interval '2 minutes' WHERE task_queue = $1`, queue))
	err = db.ClaimWorkerPolicy(ctx, queue, idem, time.Minute)
	var change *store.PolicyChangeError
	require.ErrorAs(t, err, &change, "the none workers are silent, not changed")
	require.Equal(t, none, change.Deployment)
	require.NoError(t, db.ChangeWorkerPolicy(ctx, queue, idem, time.Minute), "the none workers are gone: a change on purpose")
	require.NoError(t, db.ClaimWorkerPolicy(ctx, queue, idem, time.Minute), "the deployment's settings now")

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

// A worker that stalled past the live window (a paused VM, a lost database) and comes back after
// the deployment's settings were changed finds out at its next report, and must stop: it is
// refused, and its report is not recorded.
func TestStalledWorkerFindsItsSettingsChanged(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	queue := "q-" + uuid.NewString()
	none := store.WorkerPolicy{Capability: "none", BookingWindow: time.Second}
	idem := store.WorkerPolicy{Capability: "idempotent", BookingWindow: time.Second}

	require.NoError(t, db.ClaimWorkerPolicy(ctx, queue, none, time.Minute))
	stalled, err := db.ReportWorkerPolicy(ctx, queue, none, time.Time{})
	require.NoError(t, err)
	again, err := db.ReportWorkerPolicy(ctx, queue, none, stalled)
	require.NoError(t, err, "nothing changed since its last report")
	require.NoError(t, db.ClaimWorkerPolicy(ctx, queue, none, time.Minute), "a second none worker")
	require.NoError(t, db.Exec(ctx, `UPDATE worker_policies SET last_seen = last_seen - interval '2 minutes' WHERE task_queue = $1`, queue))
	require.NoError(t, db.ChangeWorkerPolicy(ctx, queue, idem, time.Minute))

	_, err = db.ReportWorkerPolicy(ctx, queue, none, again.Add(-2*time.Minute))
	var change *store.PolicyChangeError
	require.ErrorAs(t, err, &change, "the stalled none worker reported on")
	require.Equal(t, idem, change.Deployment)
	require.Contains(t, err.Error(), "capability idempotent")
	err = db.ChangeWorkerPolicy(ctx, queue, none, time.Minute)
	var conflict *store.PolicyConflictError
	require.ErrorAs(t, err, &conflict, "a change while a worker with other settings is live")
}
