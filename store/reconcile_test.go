package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
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
		require.NoError(t, db.EachRefundCreated(ctx, from, to, statuses, merchants, func(r payment.Refund, _ time.Time) error {
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
	require.ErrorIs(t, db.EachRefundCreated(ctx, from, to, both, []uuid.UUID{mA}, func(payment.Refund, time.Time) error { n++; return stop }), stop)
	require.Equal(t, 1, n, "an error from fn stops the iteration")
}

// backdate moves what a payment recorded so far (its creation, its last change, when it became
// unknown, its authorization's deadline, its captures' and cancels' arrival) back by d, as if it had
// happened then; what it records later happens now.
func backdate(t *testing.T, id uuid.UUID, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	iv := d.String()
	require.NoError(t, db.Exec(ctx, `UPDATE payments SET created_at = created_at - $2::interval, updated_at = updated_at - $2::interval,
		capture_before = capture_before - $2::interval, unknown_at = unknown_at - $2::interval WHERE id = $1`, id, iv))
	require.NoError(t, db.Exec(ctx, `UPDATE payment_commands SET created_at = created_at - $2::interval,
		updated_at = updated_at - $2::interval WHERE payment_id = $1`, id, iv))
}

// A payment whose outcome was unknown on its day and that was settled as charged days later (by
// an operator who had the bank's word) was decided when it became unknown: kasa sent nothing
// after that. A complete file of that day that does not list it finds it missing, whatever day
// the settlement came: the bank's file and its word disagree.
func TestReconcileSettledLaterIsMissingFromItsDay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := reconcile.DayOf(time.Now().AddDate(0, 0, -2))
	noon := d.Start().Add(12 * time.Hour)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, mID, aID uuid.UUID) uuid.UUID
	}{
		{"automatic", func(t *testing.T, mID, aID uuid.UUID) uuid.UUID {
			req := payment.Request{InvoiceID: "inv", AmountMinor: 1_000, Currency: "TRY", AccountID: aID, PaymentType: "purchase"}
			_, p, _, err := db.Begin(ctx, store.BeginInput{MerchantID: mID, Key: "auto", Request: req, OperationID: idAt(noon), Lease: time.Minute})
			require.NoError(t, err)
			require.NoError(t, db.Reserve(ctx, p.ID))
			_, err = db.MarkUnknown(ctx, p.ID)
			require.NoError(t, err)
			backdate(t, p.ID, time.Since(noon))
			_, err = db.Finalize(ctx, p.ID, "ch_by_hand")
			require.NoError(t, err)
			return p.ID
		}},
		{"manual, captured on its day", func(t *testing.T, mID, aID uuid.UUID) uuid.UUID {
			p := authorizedAs(t, mID, aID, "manual", 1_000, idAt(noon))
			c, _, err := db.BeginCommand(ctx, store.Command{MerchantID: mID, Key: "manual-cap", ID: payment.NewID(), PaymentID: p.ID,
				Kind: payment.CommandCapture, RequestHash: "h", AmountMinor: 1_000}, time.Minute)
			require.NoError(t, err)
			_, err = db.MarkUnknown(ctx, p.ID)
			require.NoError(t, err)
			backdate(t, p.ID, time.Since(noon))
			_, err = db.Captured(ctx, p.ID, 1_000, "cap_by_hand", c.ID)
			require.NoError(t, err)
			return p.ID
		}},
		{"manual, captured the day after its authorization", func(t *testing.T, mID, aID uuid.UUID) uuid.UUID {
			before := noon.AddDate(0, 0, -1)
			p := authorizedAs(t, mID, aID, "manual-later", 1_000, idAt(before))
			backdate(t, p.ID, time.Since(before))
			c, _, err := db.BeginCommand(ctx, store.Command{MerchantID: mID, Key: "manual-later-cap", ID: payment.NewID(), PaymentID: p.ID,
				Kind: payment.CommandCapture, RequestHash: "h", AmountMinor: 1_000}, time.Minute)
			require.NoError(t, err)
			_, err = db.MarkUnknown(ctx, p.ID)
			require.NoError(t, err)
			require.NoError(t, db.Exec(ctx, `UPDATE payments SET updated_at = updated_at - $2::interval, unknown_at = unknown_at - $2::interval WHERE id = $1`, p.ID, time.Since(noon).String()))
			require.NoError(t, db.Exec(ctx, `UPDATE payment_commands SET created_at = created_at - $2::interval WHERE payment_id = $1`, p.ID, time.Since(noon).String()))
			_, err = db.Captured(ctx, p.ID, 1_000, "cap_by_hand", c.ID)
			require.NoError(t, err)
			return p.ID
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mID, aID := fixture(t, 10_000)
			id := tc.run(t, mID, aID)
			r := &reconcile.Reconciler{Store: db}
			file := &reconcile.File{Trailers: []reconcile.Trailer{{Day: d, AsOf: d.End().Add(5 * time.Minute)}}}
			rep, err := r.Reconcile(ctx, file, reconcile.Options{Merchants: []uuid.UUID{mID}})
			require.NoError(t, err)
			require.Empty(t, rep.Pending)
			require.Len(t, rep.Mismatches, 1, "%+v", rep)
			require.Equal(t, reconcile.KindSucceededButMissing, rep.Mismatches[0].Kind)
			require.Equal(t, id.String(), rep.Mismatches[0].PaymentID)

			// The day it was settled on is not its day: that day's file leaves it alone.
			today := reconcile.DayOf(time.Now())
			file = &reconcile.File{Trailers: []reconcile.Trailer{{Day: today, AsOf: time.Now()}}}
			rep, err = r.Reconcile(ctx, file, reconcile.Options{Merchants: []uuid.UUID{mID}})
			require.NoError(t, err)
			require.Empty(t, rep.Pending)
			require.Empty(t, rep.Mismatches)
		})
	}
}

// Migration 00035 run again (its index left invalid by a build that failed) builds the index again.
func TestManualUnknownAtIndexRebuilt(t *testing.T) {
	t.Parallel()
	requireIndexRebuilt(t, "payments_manual_unknown_at", 35)
}

// A refund whose outcome was unknown on its day and that was settled as paid back days later
// was decided when it became unknown, as a payment is: its day's complete file, which covers
// refunds and does not list it, finds it missing.
func TestReconcileRefundSettledLaterIsMissingFromItsDay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	d := reconcile.DayOf(time.Now().AddDate(0, 0, -2))
	noon := d.Start().Add(12 * time.Hour)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 100_000})
	req := payment.Request{InvoiceID: "inv", AmountMinor: 10_000, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
	_, p, _, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: "pay", Request: req, OperationID: idAt(noon), Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, own.Reserve(ctx, p.ID))
	_, err = own.Finalize(ctx, p.ID, "ch_1")
	require.NoError(t, err)
	rreq, err := payment.ParseRefundRequest([]byte(`{"amount":"30"}`))
	require.NoError(t, err)
	_, r, _, err := own.BeginRefund(ctx, store.BeginRefundInput{MerchantID: m.ID, PaymentID: p.ID, Key: "refund", Request: rreq,
		OperationID: idAt(noon.Add(time.Minute)), Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, own.HoldRefund(ctx, r.ID))
	_, err = own.MarkRefundUnknown(ctx, r.ID)
	require.NoError(t, err)
	// Refunds are immutable but for their progress: this database's is moved back by hand.
	back := time.Since(noon).String()
	require.NoError(t, own.Exec(ctx, `ALTER TABLE refunds DISABLE TRIGGER refunds_immutable`))
	require.NoError(t, own.Exec(ctx, `UPDATE refunds SET created_at = created_at - $2::interval, updated_at = updated_at - $2::interval,
		unknown_at = unknown_at - $2::interval WHERE id = $1`, r.ID, back))
	require.NoError(t, own.Exec(ctx, `ALTER TABLE refunds ENABLE TRIGGER refunds_immutable`))
	require.NoError(t, own.Exec(ctx, `UPDATE payments SET created_at = created_at - $2::interval, updated_at = updated_at - $2::interval
		WHERE id = $1`, p.ID, back))
	_, err = own.PostRefund(ctx, r.ID, "rf_by_hand")
	require.NoError(t, err)

	file := &reconcile.File{Typed: true, Scope: &reconcile.Scope{Merchants: []uuid.UUID{m.ID}, Charges: true, Refunds: true},
		Lines: []reconcile.Line{{Number: 2, SettlementDate: d, ProviderChargeID: "ch_1", Reference: p.ID, AmountMinor: 10_000,
			Currency: "TRY", Status: reconcile.StatusSettled, Type: reconcile.TypeCharge}},
		Trailers: []reconcile.Trailer{{Day: d, Lines: 1, AsOf: d.End().Add(5 * time.Minute)}}}
	rep, err := (&reconcile.Reconciler{Store: own}).Reconcile(ctx, file, reconcile.Options{})
	require.NoError(t, err)
	require.Equal(t, 1, rep.Counts.Matched, "%+v", rep)
	require.Empty(t, rep.RefundPending)
	require.Len(t, rep.RefundMismatches, 1, "%+v", rep)
	require.Equal(t, reconcile.KindSucceededButMissing, rep.RefundMismatches[0].Kind)
	require.Equal(t, r.ID.String(), rep.RefundMismatches[0].RefundID)
}

// Migration 34 gives the payments and refunds unknown before it the time they became
// unknown, their updated_at; nothing else.
func TestUnknownAtMigrationsFillTheUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	var err error
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 100_000})
	begin := func(key string, manual bool) payment.Payment {
		req := payment.Request{InvoiceID: key, AmountMinor: 1_000, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase", CaptureManual: manual}
		_, p, _, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, Request: req, OperationID: payment.NewID(),
			Lease: time.Minute, CaptureWindow: time.Hour})
		require.NoError(t, err)
		require.NoError(t, own.Reserve(ctx, p.ID))
		return p
	}
	auto := begin("auto", false)
	_, err = own.MarkUnknown(ctx, auto.ID)
	require.NoError(t, err)
	manual := begin("manual", true)
	_, err = own.Authorized(ctx, manual.ID, "au_1")
	require.NoError(t, err)
	_, err = own.MarkUnknown(ctx, manual.ID)
	require.NoError(t, err)
	paid := begin("paid", false)
	_, err = own.Finalize(ctx, paid.ID, "ch_1")
	require.NoError(t, err)
	rreq, err := payment.ParseRefundRequest([]byte(`{"amount":"1"}`))
	require.NoError(t, err)
	_, rf, _, err := own.BeginRefund(ctx, store.BeginRefundInput{MerchantID: m.ID, PaymentID: paid.ID, Key: "r", Request: rreq,
		OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, own.HoldRefund(ctx, rf.ID))
	_, err = own.MarkRefundUnknown(ctx, rf.ID)
	require.NoError(t, err)

	require.NoError(t, own.Exec(ctx, `UPDATE payments SET unknown_at = NULL`))
	require.NoError(t, own.Exec(ctx, `UPDATE refunds SET unknown_at = NULL`))
	require.NoError(t, own.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id >= 34`))
	again, err := store.Open(ctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true})
	require.NoError(t, err)
	defer again.Close()
	filled := func(table string, id uuid.UUID) bool {
		var ok bool
		require.NoError(t, again.QueryRow(ctx, `SELECT unknown_at IS NOT DISTINCT FROM updated_at AND unknown_at IS NOT NULL FROM `+table+` WHERE id = $1`,
			[]any{id}, &ok))
		return ok
	}
	require.True(t, filled("payments", auto.ID))
	require.True(t, filled("payments", manual.ID), "its capture is unknown")
	require.True(t, filled("refunds", rf.ID))
	var n int
	require.NoError(t, again.QueryRow(ctx, `SELECT count(*) FROM payments WHERE unknown_at IS NOT NULL`, nil, &n))
	require.Equal(t, 2, n, "the succeeded one has none")
}

// An authorization whose answer was lost and that was found later waits for its capture again:
// its capture is a new step, decided when it is posted, not when the authorization was unknown.
func TestFoundAuthorizationIsDecidedByItsCapture(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	req := payment.Request{InvoiceID: "found", AmountMinor: 1_000, Currency: "TRY", AccountID: aID, PaymentType: "purchase", CaptureManual: true}
	_, p, _, err := db.Begin(ctx, store.BeginInput{MerchantID: mID, Key: "found", Request: req, OperationID: payment.NewID(),
		Lease: time.Minute, CaptureWindow: time.Hour})
	require.NoError(t, err)
	require.NoError(t, db.Reserve(ctx, p.ID))
	_, err = db.MarkUnknown(ctx, p.ID)
	require.NoError(t, err)
	require.NoError(t, db.Exec(ctx, `UPDATE payments SET unknown_at = unknown_at - interval '1 hour' WHERE id = $1`, p.ID))
	_, err = db.Authorized(ctx, p.ID, "au_1")
	require.NoError(t, err)
	_, err = db.Captured(ctx, p.ID, 1_000, "au_1", uuid.Nil)
	require.NoError(t, err)
	day := time.Now().UTC().Truncate(24 * time.Hour)
	n := 0
	require.NoError(t, db.EachPaymentCreated(ctx, day.Add(-24*time.Hour), day.Add(48*time.Hour), []payment.Status{payment.StatusSucceeded},
		[]uuid.UUID{mID}, func(_ payment.Payment, decided time.Time) error {
			n++
			require.WithinDuration(t, time.Now(), decided, 5*time.Second, "decided when captured")
			return nil
		}))
	require.Equal(t, 1, n)
}

// SettlementListings keeps each reference's days once, a kind apart from the other, and records
// nothing when asked only to read (a dry run).
func TestSettlementListings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d1 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	d2 := d1.AddDate(0, 0, 1)
	a, b := payment.NewID(), payment.NewID()

	got, err := db.SettlementListings(ctx, "charge", []uuid.UUID{a, a, b}, []time.Time{d1, d1, d2}, false)
	require.NoError(t, err)
	require.Empty(t, got, "a read records nothing")
	got, err = db.SettlementListings(ctx, "charge", []uuid.UUID{a, a, b}, []time.Time{d1, d1, d2}, true)
	require.NoError(t, err, "a reference listed twice on one day is one listing")
	require.Equal(t, map[uuid.UUID][]time.Time{a: {d1}, b: {d2}}, got)
	got, err = db.SettlementListings(ctx, "charge", []uuid.UUID{a}, []time.Time{d2}, true)
	require.NoError(t, err)
	require.ElementsMatch(t, []time.Time{d1, d2}, got[a])
	got, err = db.SettlementListings(ctx, "refund", []uuid.UUID{a}, []time.Time{d1}, false)
	require.NoError(t, err)
	require.Empty(t, got, "a refund's listings are not a payment's")
}

// Imports of one file running at once (a scheduled import and an operator's upload) record its
// listings in whatever order each walks them: they never wait for each other in a cycle, and each
// reads back every day the file lists its references on.
func TestSettlementListingsOfConcurrentImports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	day := time.Date(2025, 4, 1, 0, 0, 0, 0, time.UTC)
	refs := make([]uuid.UUID, 400)
	days := make([]time.Time, len(refs))
	for i := range refs {
		refs[i], days[i] = payment.NewID(), day
	}
	for round := range 5 {
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			own := slices.Clone(refs)
			rand.Shuffle(len(own), func(a, b int) { own[a], own[b] = own[b], own[a] })
			wg.Go(func() {
				got, err := db.SettlementListings(ctx, "charge", own, days, true)
				if err == nil && len(got) != len(refs) {
					err = fmt.Errorf("read back %d of %d references", len(got), len(refs))
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "round %d, import %d", round, i)
		}
		for i := range refs { // the next round's references are new: each is inserted again
			refs[i] = payment.NewID()
		}
	}
}

// Imports that prove the same days complete for the same merchants, named in another order,
// record their completions without waiting for each other in a cycle.
func TestSettlementCompletionsOfConcurrentImports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	merchants := make([]uuid.UUID, 100)
	days := []time.Time{time.Date(2025, 5, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, 5, 2, 0, 0, 0, 0, time.UTC)}
	asOf := []time.Time{days[0].Add(30 * time.Hour), days[1].Add(30 * time.Hour)}
	for round := range 5 {
		for i := range merchants {
			merchants[i] = payment.NewID()
		}
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			own := slices.Clone(merchants)
			rand.Shuffle(len(own), func(a, b int) { own[a], own[b] = own[b], own[a] })
			wg.Go(func() { errs[i] = db.RecordSettlementCompletions(ctx, "charge", own, days, asOf) })
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "round %d, import %d", round, i)
		}
		got, err := db.SettlementCompletions(ctx, "charge", days, merchants)
		require.NoError(t, err)
		for _, d := range days {
			require.Len(t, got[d], len(merchants), "day %s", d)
		}
	}
}

// In a rolling upgrade across migration 34 a worker of the earlier release marks payments and
// refunds unknown without unknown_at (it knows no such column). Settled later by this release,
// each was still decided when it became unknown, its updated_at then: its day's complete file,
// which does not list it, finds it missing, and the day it was settled on leaves it alone.
func TestReconcileSettledLaterAfterAnEarlierReleaseMarkedItUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	d := reconcile.DayOf(time.Now().AddDate(0, 0, -2))
	noon := d.Start().Add(12 * time.Hour)
	back := time.Since(noon).String()
	// earlier is what the earlier release's worker left: unknown, and no unknown_at.
	earlier := func(t *testing.T, table string, id uuid.UUID) {
		t.Helper()
		require.NoError(t, own.Exec(ctx, `ALTER TABLE refunds DISABLE TRIGGER refunds_immutable`))
		require.NoError(t, own.Exec(ctx, `UPDATE `+table+` SET created_at = created_at - $2::interval,
			updated_at = updated_at - $2::interval, unknown_at = NULL WHERE id = $1`, id, back))
		require.NoError(t, own.Exec(ctx, `ALTER TABLE refunds ENABLE TRIGGER refunds_immutable`))
		require.NoError(t, own.Exec(ctx, `UPDATE payment_commands SET created_at = created_at - $2::interval WHERE payment_id = $1`, id, back))
	}
	req := func(m testkit.Merchant, inv string) payment.Request {
		return payment.Request{InvoiceID: inv, AmountMinor: 1_000, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, m testkit.Merchant) (paymentID, refundID uuid.UUID)
	}{
		{"automatic payment", func(t *testing.T, m testkit.Merchant) (uuid.UUID, uuid.UUID) {
			_, p, _, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: "auto", Request: req(m, "auto"), OperationID: idAt(noon), Lease: time.Minute})
			require.NoError(t, err)
			require.NoError(t, own.Reserve(ctx, p.ID))
			_, err = own.MarkUnknown(ctx, p.ID)
			require.NoError(t, err)
			earlier(t, "payments", p.ID)
			_, err = own.Finalize(ctx, p.ID, "ch_by_hand")
			require.NoError(t, err)
			return p.ID, uuid.Nil
		}},
		{"manual payment", func(t *testing.T, m testkit.Merchant) (uuid.UUID, uuid.UUID) {
			r := req(m, "manual")
			r.CaptureManual = true
			_, p, _, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: "manual", Request: r, OperationID: idAt(noon.Add(time.Minute)),
				Lease: time.Minute, CaptureWindow: time.Hour})
			require.NoError(t, err)
			require.NoError(t, own.Reserve(ctx, p.ID))
			_, err = own.Authorized(ctx, p.ID, "au_1")
			require.NoError(t, err)
			c, _, err := own.BeginCommand(ctx, store.Command{MerchantID: m.ID, Key: "manual-cap", ID: payment.NewID(), PaymentID: p.ID,
				Kind: payment.CommandCapture, RequestHash: "h", AmountMinor: 1_000}, time.Minute)
			require.NoError(t, err)
			_, err = own.MarkUnknown(ctx, p.ID)
			require.NoError(t, err)
			earlier(t, "payments", p.ID)
			_, err = own.Captured(ctx, p.ID, 1_000, "cap_by_hand", c.ID)
			require.NoError(t, err)
			return p.ID, uuid.Nil
		}},
		{"refund", func(t *testing.T, m testkit.Merchant) (uuid.UUID, uuid.UUID) {
			_, p, _, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: "refunded", Request: req(m, "refunded"), OperationID: idAt(noon.Add(2 * time.Minute)), Lease: time.Minute})
			require.NoError(t, err)
			require.NoError(t, own.Reserve(ctx, p.ID))
			_, err = own.Finalize(ctx, p.ID, "ch_1")
			require.NoError(t, err)
			rreq, err := payment.ParseRefundRequest([]byte(`{"amount":"3"}`))
			require.NoError(t, err)
			_, r, _, err := own.BeginRefund(ctx, store.BeginRefundInput{MerchantID: m.ID, PaymentID: p.ID, Key: "refund", Request: rreq,
				OperationID: idAt(noon.Add(3 * time.Minute)), Lease: time.Minute})
			require.NoError(t, err)
			require.NoError(t, own.HoldRefund(ctx, r.ID))
			_, err = own.MarkRefundUnknown(ctx, r.ID)
			require.NoError(t, err)
			earlier(t, "refunds", r.ID)
			require.NoError(t, own.Exec(ctx, `UPDATE payments SET created_at = created_at - $2::interval, updated_at = updated_at - $2::interval
				WHERE id = $1`, p.ID, back))
			_, err = own.PostRefund(ctx, r.ID, "rf_by_hand")
			require.NoError(t, err)
			return p.ID, r.ID
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 100_000})
			paymentID, refundID := tc.run(t, m)
			scope := &reconcile.Scope{Merchants: []uuid.UUID{m.ID}, Charges: true, Refunds: true}
			file := &reconcile.File{Typed: true, Scope: scope, Trailers: []reconcile.Trailer{{Day: d, AsOf: d.End().Add(5 * time.Minute)}}}
			if refundID != uuid.Nil {
				file.Lines = []reconcile.Line{{Number: 2, SettlementDate: d, ProviderChargeID: "ch_1", Reference: paymentID, AmountMinor: 1_000,
					Currency: "TRY", Status: reconcile.StatusSettled, Type: reconcile.TypeCharge}}
				file.Trailers[0].Lines = 1
			}
			rep, err := (&reconcile.Reconciler{Store: own}).Reconcile(ctx, file, reconcile.Options{DryRun: true})
			require.NoError(t, err)
			var missing []string
			for _, mm := range rep.Mismatches {
				if mm.Kind == reconcile.KindSucceededButMissing {
					missing = append(missing, mm.PaymentID)
				}
			}
			for _, mm := range rep.RefundMismatches {
				if mm.Kind == reconcile.KindSucceededButMissing {
					missing = append(missing, mm.RefundID)
				}
			}
			want := paymentID
			if refundID != uuid.Nil {
				want = refundID
			}
			require.Contains(t, missing, want.String(), "its day's file finds it missing: %+v", rep)
			require.Empty(t, rep.Pending)
			require.Empty(t, rep.RefundPending)
		})
	}
}

// SettlementCompletions answers, for a kind, a day and merchants, how far an import proved the day
// complete: by a scope naming the merchant, or every merchant (uuid.Nil), the latest as_of of each;
// recording a day again adds nothing.
func TestSettlementCompletions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Days no other test imports: the rows for every merchant are shared.
	d1 := time.Date(1991, 3, 1, 0, 0, 0, 0, time.UTC)
	d2 := d1.AddDate(0, 0, 1)
	a, b, c := payment.NewID(), payment.NewID(), payment.NewID()
	early, late := d2.Add(5*time.Minute), d2.Add(time.Hour)

	got, err := db.SettlementCompletions(ctx, "charge", []time.Time{d1, d2}, []uuid.UUID{a, b})
	require.NoError(t, err)
	require.Empty(t, got)

	require.NoError(t, db.RecordSettlementCompletions(ctx, "charge", []uuid.UUID{a}, []time.Time{d1}, []time.Time{early}))
	require.NoError(t, db.RecordSettlementCompletions(ctx, "charge", []uuid.UUID{a}, []time.Time{d1}, []time.Time{early}), "the same file again")
	require.NoError(t, db.RecordSettlementCompletions(ctx, "charge", []uuid.UUID{a, b}, []time.Time{d1}, []time.Time{late}))
	require.NoError(t, db.RecordSettlementCompletions(ctx, "charge", []uuid.UUID{uuid.Nil}, []time.Time{d2}, []time.Time{late}))
	require.NoError(t, db.RecordSettlementCompletions(ctx, "refund", []uuid.UUID{c}, []time.Time{d1, d2}, []time.Time{early, late}))

	got, err = db.SettlementCompletions(ctx, "charge", []time.Time{d1, d2}, []uuid.UUID{a, c})
	require.NoError(t, err)
	require.Equal(t, map[time.Time]map[uuid.UUID]time.Time{
		d1: {a: late},        // the latest of its two; b is not asked for
		d2: {uuid.Nil: late}, // every merchant's
	}, normalize(got))
	got, err = db.SettlementCompletions(ctx, "refund", []time.Time{d1}, []uuid.UUID{a, c})
	require.NoError(t, err)
	require.Equal(t, map[time.Time]map[uuid.UUID]time.Time{d1: {c: early}}, normalize(got), "a refund's days are not a payment's")

	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM settlement_completions WHERE day = $1 AND merchant_id = $2`, []any{d1, a}, &n))
	require.Equal(t, 2, n, "one row a day, scope and as_of")
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM settlement_completions WHERE day = $1 AND merchant_id IS NULL`, []any{d2}, &n))
	require.Equal(t, 1, n, "every merchant is kept as NULL")
}

// normalize puts the times of a completions map in UTC, for comparing.
func normalize(m map[time.Time]map[uuid.UUID]time.Time) map[time.Time]map[uuid.UUID]time.Time {
	out := map[time.Time]map[uuid.UUID]time.Time{}
	for d, ms := range m {
		out[d.UTC()] = map[uuid.UUID]time.Time{}
		for id, at := range ms {
			out[d.UTC()][id] = at.UTC()
		}
	}
	return out
}
