package tests

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/worker"
	"github.com/kasa-pay/kasa/workflows"
)

// downBeforeSend is the database failing as a charge's send is recorded, fails times.
type downBeforeSend struct {
	activities.Store
	fails atomic.Int32
}

func (d *downBeforeSend) BeginChargeSend(ctx context.Context, id uuid.UUID, send int) (bool, error) {
	if d.fails.Add(-1) >= 0 {
		return false, errors.New("connection refused")
	}
	return d.Store.BeginChargeSend(ctx, id, send)
}

// A database that fails as a payment's send is recorded, before anything went to a bank without
// idempotency: nothing is in doubt, so the payment is charged once the database is back, never
// parked unknown for reconciliation.
func TestDatabaseDownBeforeTheSendIsNotUnknown(t *testing.T) {
	for _, capability := range []workflows.Capability{workflows.CapabilityNone, workflows.CapabilityInquiry} {
		t.Run(string(capability), func(t *testing.T) {
			ctx := context.Background()
			s := newStack(t, capability)
			m := s.newMerchant()
			acct := s.newAccount(m, "TRY", "100.00")
			own := workflows.Starter{Client: tc, TaskQueue: "down-" + uuid.NewString()}
			down := &downBeforeSend{Store: db}
			down.fails.Store(2)
			w := worker.New(tc, own.TaskQueue, &activities.Activities{Store: down, Provider: provider.New(s.sim.URL, 5*time.Second),
				Policy: workflows.ChargePolicy{Capability: capability}}, nil)
			require.NoError(t, w.Start())
			t.Cleanup(w.Stop)

			p := beginPayment(t, m, acct, "down", "10.00", time.Minute, false)
			_, err := own.StartPayment(ctx, "down", workflows.InputFor(p))
			require.NoError(t, err)

			var got payment.Payment
			require.Eventually(t, func() bool {
				got, err = db.Payment(ctx, p.ID)
				require.NoError(t, err)
				return got.Status != payment.StatusProcessing
			}, 60*time.Second, 100*time.Millisecond)
			require.Equal(t, payment.StatusSucceeded, got.Status, "the send never went out: nothing is in doubt")
			require.Less(t, down.fails.Load(), int32(0), "the send record failed twice first")
			require.Equal(t, 1, s.simCount(p.ID.String()))
			require.Equal(t, "90.00", s.account(m, acct)["balance"])
			require.Equal(t, "0.00", s.account(m, acct)["reserved"])
			requireVerified(t)
		})
	}
}
