package store_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

func TestReconciliationReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mA, aA := fixture(t, 10_000)
	mB, aB := fixture(t, 10_000)

	_, unknownA, _, err := begin(t, mA, aA, "u", "inv-u", 100)
	require.NoError(t, err)
	require.NoError(t, db.Reserve(ctx, unknownA.ID))
	_, err = db.MarkUnknown(ctx, unknownA.ID)
	require.NoError(t, err)
	_, okA, _, err := begin(t, mA, aA, "s", "inv-s", 200)
	require.NoError(t, err)
	require.NoError(t, db.Reserve(ctx, okA.ID))
	_, err = db.Finalize(ctx, okA.ID, "ch_1")
	require.NoError(t, err)
	_, procA, _, err := begin(t, mA, aA, "p", "inv-p", 300)
	require.NoError(t, err)
	_, unknownB, _, err := begin(t, mB, aB, "u", "inv-u", 400)
	require.NoError(t, err)
	require.NoError(t, db.Reserve(ctx, unknownB.ID))
	_, err = db.MarkUnknown(ctx, unknownB.ID)
	require.NoError(t, err)

	got, err := db.PaymentsByID(ctx, []uuid.UUID{unknownA.ID, okA.ID, payment.NewID()})
	require.NoError(t, err)
	byID := map[uuid.UUID]payment.Payment{}
	for _, p := range got {
		byID[p.ID] = p
	}
	require.Len(t, byID, 2, "the id nobody has is simply absent")
	require.Equal(t, payment.StatusUnknown, byID[unknownA.ID].Status)
	require.Equal(t, "ch_1", byID[okA.ID].ProviderReference)
	require.Equal(t, mA, byID[okA.ID].MerchantID)
	require.Equal(t, "s", byID[okA.ID].IdempotencyKey)

	collect := func(from, to time.Time, merchants ...uuid.UUID) map[uuid.UUID]payment.Status {
		out := map[uuid.UUID]payment.Status{}
		err := db.EachPaymentCreated(ctx, from, to, []payment.Status{payment.StatusUnknown, payment.StatusSucceeded}, merchants,
			func(p payment.Payment, _ time.Time) error {
				out[p.ID] = p.Status
				return nil
			})
		require.NoError(t, err)
		return out
	}
	day := time.Now().UTC().Truncate(24 * time.Hour)
	scoped := collect(day.Add(-24*time.Hour), day.Add(48*time.Hour), mA)
	require.Equal(t, map[uuid.UUID]payment.Status{unknownA.ID: payment.StatusUnknown, okA.ID: payment.StatusSucceeded}, scoped,
		"only merchant A's unknown and succeeded payments; processing ones are not returned")
	require.NotContains(t, scoped, procA.ID)

	all := collect(day.Add(-24*time.Hour), day.Add(48*time.Hour))
	require.Contains(t, all, unknownB.ID, "no merchants: every merchant")
	require.Contains(t, all, okA.ID)

	require.Empty(t, collect(day.Add(-48*time.Hour), day.Add(-24*time.Hour), mA, mB), "nothing created on another day")
}

// A payment's decided time is when it left processing: a refund moves its updated_at, not that.
func TestReconciliationDecidedTimeIgnoresRefunds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m, a := fixture(t, 100_000)
	refunded := paid(t, m, a, 1_000)
	_, unknown, _, err := begin(t, m, a, "u", "inv-u", 100)
	require.NoError(t, err)
	require.NoError(t, db.Reserve(ctx, unknown.ID))
	_, err = db.MarkUnknown(ctx, unknown.ID)
	require.NoError(t, err)
	decidedAt := func() map[uuid.UUID][2]time.Time {
		out := map[uuid.UUID][2]time.Time{}
		day := time.Now().UTC().Truncate(24 * time.Hour)
		require.NoError(t, db.EachPaymentCreated(ctx, day.Add(-24*time.Hour), day.Add(48*time.Hour),
			[]payment.Status{payment.StatusUnknown, payment.StatusSucceeded}, []uuid.UUID{m},
			func(p payment.Payment, decided time.Time) error {
				out[p.ID] = [2]time.Time{p.UpdatedAt, decided}
				return nil
			}))
		return out
	}
	before := decidedAt()
	require.Equal(t, before[refunded][0], before[refunded][1], "not refunded yet: decided when it last changed")
	require.Equal(t, before[unknown.ID][0], before[unknown.ID][1], "an unknown payment was decided when it became unknown")

	time.Sleep(10 * time.Millisecond)
	_, r, _, err := beginRefund(t, m, refunded, "r", `{"amount":"1.00"}`)
	require.NoError(t, err)
	require.NoError(t, db.HoldRefund(ctx, r.ID))
	_, err = db.PostRefund(ctx, r.ID, "rf_1")
	require.NoError(t, err)

	after := decidedAt()
	require.True(t, after[refunded][0].After(before[refunded][0]), "the refund moved updated_at")
	require.True(t, after[refunded][1].Equal(before[refunded][1]), "but not when the payment was decided: %v -> %v", before[refunded][1], after[refunded][1])
}

func TestMinUUIDv7BoundsMintedIDs(t *testing.T) {
	t.Parallel()
	for range 1000 {
		before := time.Now()
		id := payment.NewID()
		after := time.Now().Add(time.Millisecond)
		lo, hi := store.MinUUIDv7(before), store.MinUUIDv7(after)
		require.LessOrEqual(t, bytes.Compare(lo[:], id[:]), 0, "%s minted after %v", id, before)
		require.Negative(t, bytes.Compare(id[:], hi[:]), "%s minted before %v", id, after)
	}
	require.Equal(t, "00000000-0000-7000-8000-000000000000", store.MinUUIDv7(time.UnixMilli(0)).String())
	require.Equal(t, "01000000-0000-7000-8000-000000000000", store.MinUUIDv7(time.UnixMilli(1<<40)).String())
}

func TestReconciliationRunsAddUp(t *testing.T) {
	ctx := context.Background()
	before, err := db.ReconcileTotals(ctx)
	require.NoError(t, err)
	day := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	for i, mismatches := range []int{2, 0} {
		require.NoError(t, db.RecordReconciliation(ctx, store.ReconciliationRun{
			ID: payment.NewID(), Source: "cli", Days: []time.Time{day, day.AddDate(0, 0, i)}, Lines: 10,
			Matched: 5, ResolvedCharged: 1, ResolvedNotCharged: 2, Pending: 0, Mismatches: mismatches, Report: []byte(`{"ok":true}`),
		}))
	}
	after, err := db.ReconcileTotals(ctx)
	require.NoError(t, err)
	require.Equal(t, store.ReconcileTotals{Runs: 2, Lines: 20, Matched: 10, ResolvedCharged: 2, ResolvedNotCharged: 4, Mismatches: 2},
		store.ReconcileTotals{Runs: after.Runs - before.Runs, Lines: after.Lines - before.Lines, Matched: after.Matched - before.Matched,
			ResolvedCharged: after.ResolvedCharged - before.ResolvedCharged, ResolvedNotCharged: after.ResolvedNotCharged - before.ResolvedNotCharged,
			Mismatches: after.Mismatches - before.Mismatches})
	require.Zero(t, after.LastMismatches, "the latest run had none")
	require.WithinDuration(t, time.Now(), after.LastRun, time.Minute)

	err = db.RecordReconciliation(ctx, store.ReconciliationRun{ID: payment.NewID(), Source: "cron", Days: []time.Time{day}, Report: []byte(`{}`)})
	require.Error(t, err, "an unknown source is refused by the schema")
}

func TestRefundReconciliationReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mA, aA := fixture(t, 100_000)
	mB, aB := fixture(t, 100_000)
	refund := func(m, a uuid.UUID, key string, to payment.Status) payment.Refund {
		t.Helper()
		_, r, _, err := beginRefund(t, m, paid(t, m, a, 1_000), key, `{"amount":"1.00"}`)
		require.NoError(t, err)
		if to == payment.StatusProcessing {
			return r
		}
		require.NoError(t, db.HoldRefund(ctx, r.ID))
		switch to {
		case payment.StatusUnknown:
			r, err = db.MarkRefundUnknown(ctx, r.ID)
		case payment.StatusSucceeded:
			r, err = db.PostRefund(ctx, r.ID, "rf_"+key)
		case payment.StatusFailed:
			r, err = db.ReleaseRefund(ctx, r.ID, payment.FailureDeclined)
		}
		require.NoError(t, err)
		require.Equal(t, to, r.Status)
		return r
	}
	unknownA := refund(mA, aA, "u", payment.StatusUnknown)
	okA := refund(mA, aA, "s", payment.StatusSucceeded)
	failedA := refund(mA, aA, "f", payment.StatusFailed)
	procA := refund(mA, aA, "p", payment.StatusProcessing)
	unknownB := refund(mB, aB, "u", payment.StatusUnknown)

	got, err := db.RefundsByID(ctx, []uuid.UUID{unknownA.ID, okA.ID, failedA.ID, okA.PaymentID, payment.NewID()})
	require.NoError(t, err)
	byID := map[uuid.UUID]payment.Refund{}
	for _, r := range got {
		byID[r.ID] = r
	}
	require.Len(t, byID, 3, "a payment's id or an id nobody has is simply absent")
	require.Equal(t, unknownA, byID[unknownA.ID])
	require.Equal(t, okA, byID[okA.ID])
	require.Equal(t, "rf_s", byID[okA.ID].ProviderReference)
	require.Equal(t, payment.FailureDeclined, byID[failedA.ID].FailureCode)
	none, err := db.RefundsByID(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, none)

	collect := func(from, to time.Time, statuses []payment.Status, merchants ...uuid.UUID) map[uuid.UUID]payment.Refund {
		out := map[uuid.UUID]payment.Refund{}
		require.NoError(t, db.EachRefundCreated(ctx, from, to, statuses, merchants, func(r payment.Refund) error {
			out[r.ID] = r
			return nil
		}))
		return out
	}
	day := time.Now().UTC().Truncate(24 * time.Hour)
	from, to := day.Add(-24*time.Hour), day.Add(48*time.Hour)
	both := []payment.Status{payment.StatusUnknown, payment.StatusSucceeded}
	require.Equal(t, map[uuid.UUID]payment.Refund{unknownA.ID: unknownA, okA.ID: okA}, collect(from, to, both, mA),
		"only merchant A's unknown and succeeded refunds; processing and failed ones are not returned")
	require.Equal(t, map[uuid.UUID]payment.Refund{unknownA.ID: unknownA}, collect(from, to, []payment.Status{payment.StatusUnknown}, mA))
	require.Equal(t, map[uuid.UUID]payment.Refund{procA.ID: procA}, collect(from, to, []payment.Status{payment.StatusProcessing}, mA))
	all := collect(from, to, both)
	require.Contains(t, all, unknownB.ID, "no merchants: every merchant")
	require.Contains(t, all, okA.ID)
	require.Empty(t, collect(day.Add(-48*time.Hour), day.Add(-24*time.Hour), both, mA, mB), "nothing created on another day")

	stop := errors.New("stop")
	n := 0
	require.ErrorIs(t, db.EachRefundCreated(ctx, from, to, both, []uuid.UUID{mA}, func(payment.Refund) error { n++; return stop }), stop)
	require.Equal(t, 1, n, "an error from fn stops the iteration")
}
