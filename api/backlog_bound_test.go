package api

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// How far past KASA_BACKLOG_MAX_QUEUED the APIs queue a burst that never drains (docs/operations.md,
// "Payday", "Refused"): each reads the drainer's record, saved every second, every half second,
// and adds what it queued itself since the drainer counted (not since its own read, which would
// leave out what it queued in between). One API alone stops at the bound; with others it goes on
// until its next read after the drainer counted theirs, about 1.5 s (2.5 s at most).
func TestBacklogBoundAcrossAPIs(t *testing.T) {
	t.Parallel()
	env := testkit.Start(t, testkit.Options{})
	ctx := context.Background()
	const bound, every = 300, 10 * time.Millisecond
	for _, apis := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d APIs", apis), func(t *testing.T) {
			m := testkit.NewMerchant(t, env.Store, testkit.MerchantOptions{})
			// An earlier case's payments leave the queue: this one's bound counts its own.
			queues, err := env.Store.ClaimQueued(ctx, uuid.Nil, 10, 10_000, time.Minute)
			require.NoError(t, err)
			for _, q := range queues {
				var ids []uuid.UUID
				for _, p := range q {
					ids = append(ids, p.ID)
				}
				require.NoError(t, env.Store.Unqueue(ctx, ids))
			}
			var (
				mu      sync.Mutex
				accepts []time.Time
				wg      sync.WaitGroup
			)
			stop := make(chan struct{})
			wg.Go(func() { // the drainer's record, saved every second; it starts nothing
				for {
					n, oldest, err := env.Store.QueuedBacklog(ctx)
					require.NoError(t, err)
					require.NoError(t, env.Store.SaveBacklogState(ctx, store.BacklogState{Queued: n, Oldest: oldest, DrainPerSecond: 1000}))
					select {
					case <-stop:
						return
					case <-time.After(time.Second):
					}
				}
			})
			for i := range apis {
				a := newAdmission(Backlog{State: env.Store, MaxRunning: 1, MaxQueued: bound}, 1)
				wg.Go(func() {
					for j := 0; ; j++ {
						select {
						case <-stop:
							return
						case <-time.After(every):
						}
						if a.admit(ctx) != nil {
							continue
						}
						key := fmt.Sprintf("api%d-%d", i, j)
						rec, _, _, err := env.Store.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, Queue: true, OperationID: payment.NewID(),
							Lease: time.Minute, Request: payment.Request{InvoiceID: key, AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}})
						require.NoError(t, err)
						require.True(t, rec.Queued)
						a.wasQueued()
						mu.Lock()
						accepts = append(accepts, time.Now())
						mu.Unlock()
					}
				})
			}
			time.Sleep(6 * time.Second)
			close(stop)
			wg.Wait()
			n, _, err := env.Store.QueuedBacklog(ctx)
			require.NoError(t, err)
			// Nothing drains: the backlog passed the bound at the bound-th accept, and each accept
			// after it is one too many.
			require.GreaterOrEqual(t, len(accepts), bound, "the burst reached the bound")
			over := accepts[len(accepts)-1].Sub(accepts[bound-1])
			t.Logf("%d APIs, each queueing a payment every %s: %d queued against a bound of %d, the last %s after it was reached",
				apis, every, n, bound, over.Round(time.Millisecond))
			if apis == 1 {
				require.LessOrEqual(t, n, int64(bound), "one API stops at the bound")
				require.GreaterOrEqual(t, n, int64(bound-10), "and not long before it")
			} else {
				require.LessOrEqual(t, over, 2500*time.Millisecond, "past the bound, the APIs queue for at most about 2.5 s")
			}
		})
	}
}
