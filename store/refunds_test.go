package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// paid runs a new payment of amount through the store's steps to succeeded and returns its id.
func paid(t *testing.T, mID, aID uuid.UUID, amount int64) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	key := uuid.NewString()
	_, p, ok, err := begin(t, mID, aID, key, key, amount)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, db.Reserve(ctx, p.ID))
	_, err = db.Finalize(ctx, p.ID, "ch_"+key)
	require.NoError(t, err)
	return p.ID
}

func beginRefund(t *testing.T, mID, paymentID uuid.UUID, key, body string) (store.Record, payment.Refund, store.Began, error) {
	t.Helper()
	req, err := payment.ParseRefundRequest([]byte(body))
	require.NoError(t, err, body)
	return db.BeginRefund(context.Background(), store.BeginRefundInput{
		MerchantID: mID, PaymentID: paymentID, Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute,
	})
}

// refundColumns are a payment's refunded and held amounts.
func refundColumns(t *testing.T, paymentID uuid.UUID) (refunded, held int64) {
	t.Helper()
	require.NoError(t, db.QueryRow(context.Background(), `SELECT refunded_minor, refund_held_minor FROM payments WHERE id = $1`,
		[]any{paymentID}, &refunded, &held))
	return refunded, held
}

func settlementAccount(t *testing.T, mID uuid.UUID) payment.Account {
	t.Helper()
	ctx := context.Background()
	var id uuid.UUID
	require.NoError(t, db.QueryRow(ctx, `SELECT id FROM accounts WHERE merchant_id = $1 AND kind = 'settlement' AND currency = 'TRY'`, []any{mID}, &id))
	a, err := db.Account(ctx, id)
	require.NoError(t, err)
	return a
}

func balance(t *testing.T, id uuid.UUID) (balance, reserved int64) {
	t.Helper()
	a, err := db.Account(context.Background(), id)
	require.NoError(t, err)
	return a.Balance, a.Reserved
}

// outboxTypes lists the event types of an aggregate, oldest first.
func outboxTypes(t *testing.T, aggregate uuid.UUID) []string {
	t.Helper()
	var types []string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT coalesce(array_agg(type ORDER BY created_at, id), '{}') FROM outbox WHERE aggregate_id = $1`,
		[]any{aggregate}, &types))
	return types
}

func TestBeginRefundNewReplayAndRaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	pay := paid(t, mID, aID, 10_000)

	// The payment's own key is another key space: a refund may reuse it.
	payRec, err := db.Record(ctx, mID, mustPayment(t, pay).IdempotencyKey)
	require.NoError(t, err)
	require.Equal(t, store.ScopePayment, payRec.Scope)
	rec, r, began, err := beginRefund(t, mID, pay, payRec.Key, `{"amount":"30.00","reason":"damaged"}`)
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	require.Equal(t, store.ScopeRefund, rec.Scope)
	require.Equal(t, r.ID, rec.OperationID)
	require.Equal(t, int64(3_000), r.AmountMinor)
	require.Equal(t, "TRY", r.Currency)
	require.Equal(t, aID, r.AccountID, "the payer's account is credited")
	require.Equal(t, payment.StatusProcessing, r.Status)
	require.Equal(t, "damaged", r.Reason)
	got, err := db.Refund(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, r, got, "what BeginRefund returns is the row")
	stored, err := db.RefundRecord(ctx, mID, payRec.Key)
	require.NoError(t, err)
	require.Equal(t, store.RecordProcessing, stored.Status)
	req, _ := payment.ParseRefundRequest([]byte(`{"amount":30,"reason":"damaged"}`))
	require.Equal(t, req.Hash(pay), stored.RequestHash)
	payRec2, err := db.Record(ctx, mID, payRec.Key)
	require.NoError(t, err)
	require.Equal(t, payRec, payRec2, "the payment's record is untouched")
	_, held := refundColumns(t, pay)
	require.Equal(t, int64(3_000), held)

	// A replay is answered from the record, whatever it asks for, and writes nothing.
	again, _, began, err := beginRefund(t, mID, pay, payRec.Key, `{"amount":"50.00"}`)
	require.NoError(t, err)
	require.Equal(t, store.BeganExisting, began)
	require.Equal(t, rec.OperationID, again.OperationID)
	require.NotEqual(t, again.RequestHash, func() string { r, _ := payment.ParseRefundRequest([]byte(`{"amount":"50.00"}`)); return r.Hash(pay) }())
	_, held = refundColumns(t, pay)
	require.Equal(t, int64(3_000), held)

	// The rest of the payment, then its replay once nothing is refundable any more.
	_, whole, began, err := beginRefund(t, mID, pay, "whole", `{}`)
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	require.Equal(t, int64(7_000), whole.AmountMinor, "no amount: all that is refundable")
	_, _, began, err = beginRefund(t, mID, pay, "whole", `{}`)
	require.NoError(t, err, "a replay is looked at before refundability")
	require.Equal(t, store.BeganExisting, began)

	// The same new key from many requests at once: one refund, one hold.
	pay2 := paid(t, mID, aID, 10_000)
	var wg sync.WaitGroup
	results := make([]store.Began, 12)
	ops := make([]uuid.UUID, 12)
	for i := range results {
		wg.Go(func() {
			rec, _, began, err := beginRefund(t, mID, pay2, "raced", `{"amount":"10.00"}`)
			require.NoError(t, err)
			results[i], ops[i] = began, rec.OperationID
		})
	}
	wg.Wait()
	n := map[store.Began]int{}
	for i, b := range results {
		n[b]++
		require.Equal(t, ops[0], ops[i], "every request sees the same refund")
	}
	require.Equal(t, 1, n[store.BeganNew], "%v", results)
	_, held = refundColumns(t, pay2)
	require.Equal(t, int64(1_000), held)
	requireVerified(t)
}

func mustPayment(t *testing.T, id uuid.UUID) payment.Payment {
	t.Helper()
	p, err := db.Payment(context.Background(), id)
	require.NoError(t, err)
	return p
}

// A refund the payment cannot take leaves nothing behind: no record, no refund, no hold.
func TestBeginRefundRefusedKeepsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	otherM, otherA := fixture(t, 100_000)
	succeeded := paid(t, mID, aID, 10_000)
	_, processing, _, err := begin(t, mID, aID, "processing", "inv-processing", 1_000)
	require.NoError(t, err)
	_, unknown, _, err := begin(t, mID, aID, "unknown", "inv-unknown", 1_000)
	require.NoError(t, err)
	require.NoError(t, db.Reserve(ctx, unknown.ID))
	_, err = db.MarkUnknown(ctx, unknown.ID)
	require.NoError(t, err)
	_, failed, _, err := begin(t, mID, aID, "failed", "inv-failed", 1_000)
	require.NoError(t, err)
	_, err = db.Release(ctx, failed.ID, payment.FailureDeclined)
	require.NoError(t, err)
	othersPayment := paid(t, otherM, otherA, 10_000)
	_, _, _, err = beginRefund(t, mID, succeeded, "partial", `{"amount":"25.50"}`)
	require.NoError(t, err)

	for _, tc := range []struct {
		name, body string
		payment    uuid.UUID
		check      func(t *testing.T, err error)
	}{
		{"processing payment", `{}`, processing.ID, func(t *testing.T, err error) { require.ErrorIs(t, err, payment.ErrPaymentNotRefundable) }},
		{"unknown payment", `{}`, unknown.ID, func(t *testing.T, err error) { require.ErrorIs(t, err, payment.ErrPaymentNotRefundable) }},
		{"failed payment", `{}`, failed.ID, func(t *testing.T, err error) { require.ErrorIs(t, err, payment.ErrPaymentNotRefundable) }},
		{"no such payment", `{}`, payment.NewID(), func(t *testing.T, err error) { require.ErrorIs(t, err, payment.ErrNotFound) }},
		{"another merchant's payment", `{}`, othersPayment, func(t *testing.T, err error) { require.ErrorIs(t, err, payment.ErrNotFound) }},
		{"more than refundable", `{"amount":"74.51"}`, succeeded, func(t *testing.T, err error) {
			var ex *payment.RefundExceedsError
			require.ErrorAs(t, err, &ex)
			require.Equal(t, payment.RefundExceedsError{Refundable: 7_450, Currency: "TRY"}, *ex)
		}},
		{"too many digits for the currency", `{"amount":"1.001"}`, succeeded, func(t *testing.T, err error) {
			var ve *payment.ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, "amount", ve.Fields[0].Field)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "refused-" + tc.name
			_, _, began, err := beginRefund(t, mID, tc.payment, key, tc.body)
			tc.check(t, err)
			require.Zero(t, began)
			_, err = db.RefundRecord(ctx, mID, key)
			require.ErrorIs(t, err, payment.ErrNotFound, "no record")
			_, err = db.RefundByKey(ctx, mID, key)
			require.ErrorIs(t, err, payment.ErrNotFound, "no refund")
		})
	}
	refunded, held := refundColumns(t, succeeded)
	require.Equal(t, [2]int64{0, 2_550}, [2]int64{refunded, held}, "only the partial refund holds")
	requireVerified(t)
}

// Eight refunds of 30.00 of one 100.00 payment at once: three fit, five are refused with what is
// left, and the payment never holds more than its amount.
func TestConcurrentRefundsNeverExceedThePayment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	pay := paid(t, mID, aID, 10_000)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			_, _, _, errs[i] = beginRefund(t, mID, pay, fmt.Sprint("par-", i), `{"amount":"30.00"}`)
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		var ex *payment.RefundExceedsError
		require.ErrorAs(t, err, &ex, "only refused for the amount, never a CHECK violation")
		require.Equal(t, int64(1_000), ex.Refundable)
	}
	require.Equal(t, 3, ok)
	refunded, held := refundColumns(t, pay)
	require.Equal(t, int64(0), refunded)
	require.Equal(t, int64(9_000), held)
	page, more, err := db.PaymentRefunds(ctx, pay, 100, nil)
	require.NoError(t, err)
	require.False(t, more)
	require.Len(t, page, 3)
	requireVerified(t)

	// The database refuses an over-hold even if the application forgot to check.
	err = db.Exec(ctx, `UPDATE payments SET refund_held_minor = refund_held_minor + 1001 WHERE id = $1`, pay)
	require.ErrorContains(t, err, "payments_refundable")
	err = db.Exec(ctx, `UPDATE payments SET refunded_minor = -1 WHERE id = $1`, pay)
	require.ErrorContains(t, err, "payments_refundable")
}

// Each step sequence of the workflow, every step run twice (a retried activity): the money, the
// payment's columns, the record and the events end where the outcome says, once.
func TestRefundStepsMoveMoneyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type step struct {
		name string
		run  func(id uuid.UUID) (payment.Refund, error)
	}
	hold := step{"hold", func(id uuid.UUID) (payment.Refund, error) {
		if err := db.HoldRefund(ctx, id); err != nil {
			return payment.Refund{}, err
		}
		return db.Refund(ctx, id)
	}}
	post := step{"post", func(id uuid.UUID) (payment.Refund, error) { return db.PostRefund(ctx, id, "rf_"+id.String()) }}
	release := step{"release", func(id uuid.UUID) (payment.Refund, error) { return db.ReleaseRefund(ctx, id, payment.FailureDeclined) }}
	unknown := step{"unknown", func(id uuid.UUID) (payment.Refund, error) { return db.MarkRefundUnknown(ctx, id) }}

	for _, tc := range []struct {
		name    string
		steps   []step
		status  payment.Status
		events  []string
		posted  bool
		reserve string // the reservation's status at the end
	}{
		{"hold, post", []step{hold, post}, payment.StatusSucceeded, []string{"refund.succeeded"}, true, "finalized"},
		{"hold, release", []step{hold, release}, payment.StatusFailed, []string{"refund.failed"}, false, "released"},
		{"hold, unknown, post", []step{hold, unknown, post}, payment.StatusSucceeded, []string{"refund.unknown", "refund.succeeded"}, true, "finalized"},
		{"hold, unknown, release", []step{hold, unknown, release}, payment.StatusFailed, []string{"refund.unknown", "refund.failed"}, false, "released"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mID, aID := fixture(t, 100_000)
			pay := paid(t, mID, aID, 10_000)
			settlement := settlementAccount(t, mID)
			require.Equal(t, int64(10_000), settlement.Balance)
			payerBefore, _ := balance(t, aID)
			_, r, _, err := beginRefund(t, mID, pay, "k", `{"amount":"40.00"}`)
			require.NoError(t, err)
			rec, err := db.RefundRecord(ctx, mID, "k")
			require.NoError(t, err)
			require.False(t, rec.WorkflowStarted)

			for _, st := range tc.steps {
				for i := range 2 {
					got, err := st.run(r.ID)
					require.NoError(t, err, "%s, run %d", st.name, i+1)
					requireVerified(t)
					switch st.name {
					case "hold":
						sb, sr := balance(t, settlement.ID)
						require.Equal(t, [2]int64{10_000, 4_000}, [2]int64{sb, sr}, "held on the settlement account once")
						rec, err := db.RefundRecord(ctx, mID, "k")
						require.NoError(t, err)
						require.True(t, rec.WorkflowStarted, "the workflow's first step records that it runs")
						require.Equal(t, payment.StatusProcessing, got.Status)
					case "unknown":
						require.Equal(t, payment.StatusUnknown, got.Status)
						rec, err := db.RefundRecord(ctx, mID, "k")
						require.NoError(t, err)
						require.Equal(t, store.RecordUnknown, rec.Status)
						require.Nil(t, rec.ResponseBody)
						sb, sr := balance(t, settlement.ID)
						require.Equal(t, [2]int64{10_000, 4_000}, [2]int64{sb, sr}, "an unknown refund keeps its hold")
						refunded, held := refundColumns(t, pay)
						require.Equal(t, [2]int64{0, 4_000}, [2]int64{refunded, held})
					}
				}
			}

			got, err := db.Refund(ctx, r.ID)
			require.NoError(t, err)
			require.Equal(t, tc.status, got.Status)
			rec, err = db.RefundRecord(ctx, mID, "k")
			require.NoError(t, err)
			require.Equal(t, store.RecordCompleted, rec.Status)
			require.Equal(t, tc.status, rec.Outcome)
			body, err := got.AnswerBody()
			require.NoError(t, err)
			require.Equal(t, string(body), string(rec.ResponseBody), "the stored answer is what the refund row renders")
			require.Equal(t, tc.events, outboxTypes(t, r.ID))

			entries, err := db.LedgerEntries(ctx, r.ID.String())
			require.NoError(t, err)
			sb, sr := balance(t, settlement.ID)
			payer, _ := balance(t, aID)
			refunded, held := refundColumns(t, pay)
			p := mustPayment(t, pay)
			var reservation string
			require.NoError(t, db.QueryRow(ctx, `SELECT status FROM balance_reservations WHERE operation_id = $1`, []any{r.ID}, &reservation))
			require.Equal(t, tc.reserve, reservation)
			if tc.posted {
				require.Len(t, entries, 2)
				byAccount := map[uuid.UUID]int64{}
				for _, e := range entries {
					require.Equal(t, "refund", e.Kind)
					byAccount[e.AccountID] += e.AmountMinor
				}
				require.Equal(t, map[uuid.UUID]int64{settlement.ID: -4_000, aID: 4_000}, byAccount)
				require.Equal(t, [2]int64{6_000, 0}, [2]int64{sb, sr})
				require.Equal(t, payerBefore+4_000, payer)
				require.Equal(t, [2]int64{4_000, 0}, [2]int64{refunded, held})
				require.Equal(t, int64(4_000), p.AmountRefunded)
				require.Equal(t, "40.00", p.Resource().AmountRefunded)
				require.Equal(t, "rf_"+r.ID.String(), got.ProviderReference)
			} else {
				require.Empty(t, entries)
				require.Equal(t, [2]int64{10_000, 0}, [2]int64{sb, sr})
				require.Equal(t, payerBefore, payer)
				require.Equal(t, [2]int64{0, 0}, [2]int64{refunded, held})
				require.Equal(t, payment.FailureDeclined, got.FailureCode)
			}

			// A final refund refuses the other outcome and stays as it is.
			if tc.posted {
				_, err = db.ReleaseRefund(ctx, r.ID, payment.FailureDeclined)
			} else {
				_, err = db.PostRefund(ctx, r.ID, "rf_late")
			}
			require.ErrorIs(t, err, payment.ErrInconsistent)
			_, err = db.MarkRefundUnknown(ctx, r.ID)
			require.ErrorIs(t, err, payment.ErrInconsistent)
			require.Equal(t, tc.events, outboxTypes(t, r.ID))
			requireVerified(t)
		})
	}
}

// The merchant's settlement account pays refunds: when it has less available than the refund,
// nothing is held and the refund is released as insufficient_funds.
func TestHoldRefundInsufficientSettlementFunds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	pay := paid(t, mID, aID, 10_000)
	settlement := settlementAccount(t, mID)
	// A payout (a balanced posting to the payer, standing in for money leaving) leaves 20.00.
	payout(t, settlement.ID, aID, 8000)
	requireVerified(t)

	_, r, _, err := beginRefund(t, mID, pay, "k", `{"amount":"30.00"}`)
	require.NoError(t, err)
	for range 2 {
		require.ErrorIs(t, db.HoldRefund(ctx, r.ID), payment.ErrInsufficientFunds)
	}
	sb, sr := balance(t, settlement.ID)
	require.Equal(t, [2]int64{2_000, 0}, [2]int64{sb, sr}, "nothing held")
	got, err := db.ReleaseRefund(ctx, r.ID, payment.FailureInsufficientFunds)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, got.Status)
	require.Equal(t, payment.FailureInsufficientFunds, got.FailureCode)
	refunded, held := refundColumns(t, pay)
	require.Equal(t, [2]int64{0, 0}, [2]int64{refunded, held})
	require.Equal(t, []string{"refund.failed"}, outboxTypes(t, r.ID))
	require.ErrorIs(t, db.HoldRefund(ctx, r.ID), payment.ErrInconsistent, "a failed refund is never held")
	sb, sr = balance(t, settlement.ID)
	require.Equal(t, [2]int64{2_000, 0}, [2]int64{sb, sr})
	requireVerified(t)

	// What the settlement account has is refundable.
	_, r2, _, err := beginRefund(t, mID, pay, "k2", `{"amount":"20.00"}`)
	require.NoError(t, err)
	require.NoError(t, db.HoldRefund(ctx, r2.ID))
	_, err = db.PostRefund(ctx, r2.ID, "rf_2")
	require.NoError(t, err)
	sb, sr = balance(t, settlement.ID)
	require.Equal(t, [2]int64{0, 0}, [2]int64{sb, sr})
	require.ErrorIs(t, db.HoldRefund(ctx, payment.NewID()), payment.ErrNotFound)
	requireVerified(t)
}

// The refund's send counter and stuck flag work as the charge's.
func TestRefundAttemptsAndStuckFlag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	pay := paid(t, mID, aID, 10_000)
	_, r, _, err := beginRefund(t, mID, pay, "k", `{}`)
	require.NoError(t, err)
	n, err := db.BeginRefundAttempt(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	first, err := db.BeginRefundSend(ctx, r.ID, 2)
	require.NoError(t, err)
	require.True(t, first)
	first, err = db.BeginRefundSend(ctx, r.ID, 2)
	require.NoError(t, err)
	require.False(t, first, "a repeat of send 2: it may have reached the provider")
	_, err = db.BeginRefundAttempt(ctx, payment.NewID())
	require.ErrorIs(t, err, payment.ErrNotFound)

	require.NoError(t, db.FlagRefundStuck(ctx, r.ID, "provider says no such charge"))
	var reason string
	require.NoError(t, db.QueryRow(ctx, `SELECT coalesce(stuck_reason, '') FROM refunds WHERE id = $1 AND stuck_since IS NOT NULL`, []any{r.ID}, &reason))
	require.Equal(t, "provider says no such charge", reason)
	require.NoError(t, db.FlagRefundStuck(ctx, r.ID, ""))
	require.NoError(t, db.QueryRow(ctx, `SELECT coalesce(stuck_reason, '') FROM refunds WHERE id = $1 AND stuck_since IS NULL`, []any{r.ID}, &reason))
	require.ErrorIs(t, db.FlagRefundStuck(ctx, payment.NewID(), "x"), payment.ErrNotFound)

	// What was asked for never changes, and a refund is never deleted.
	require.ErrorContains(t, db.Exec(ctx, `UPDATE refunds SET amount_minor = 1 WHERE id = $1`, r.ID), "immutable")
	require.ErrorContains(t, db.Exec(ctx, `DELETE FROM refunds WHERE id = $1`, r.ID), "cannot be deleted")
}

// A refund whose requester died before starting its workflow is found by the sweeper's query,
// with its scope, and taken over in its own key space.
func TestStrandedRefundRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	pay := paid(t, mID, aID, 10_000)
	req, err := payment.ParseRefundRequest([]byte(`{}`))
	require.NoError(t, err)
	_, _, _, err = db.BeginRefund(ctx, store.BeginRefundInput{MerchantID: mID, PaymentID: pay, Key: "stranded", Request: req,
		OperationID: payment.NewID(), Lease: time.Millisecond})
	require.NoError(t, err)
	_, _, _, err = db.Begin(ctx, store.BeginInput{MerchantID: mID, Key: "stranded", OperationID: payment.NewID(), Lease: time.Millisecond,
		Request: payment.Request{InvoiceID: "stranded", AmountMinor: 100, Currency: "TRY", AccountID: aID, PaymentType: "purchase"}})
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	recs, err := db.Stranded(ctx, 10, &mID)
	require.NoError(t, err)
	scopes := map[store.Scope]string{}
	for _, r := range recs {
		scopes[r.Scope] = r.Key
	}
	require.Equal(t, map[store.Scope]string{store.ScopePayment: "stranded", store.ScopeRefund: "stranded"}, scopes)

	won, err := db.TakeOverRefund(ctx, mID, "stranded", time.Minute)
	require.NoError(t, err)
	require.True(t, won)
	won, err = db.TakeOverRefund(ctx, mID, "stranded", time.Minute)
	require.NoError(t, err)
	require.False(t, won, "the lease is taken")
	won, err = db.TakeOver(ctx, mID, "stranded", time.Minute)
	require.NoError(t, err)
	require.True(t, won, "the payment's record is another record")
}

func TestPaymentRefundsPages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	pay := paid(t, mID, aID, 10_000)
	other := paid(t, mID, aID, 10_000)
	_, _, _, err := beginRefund(t, mID, other, "other", `{"amount":"1"}`)
	require.NoError(t, err)
	var ids []uuid.UUID
	for i := range 5 {
		_, r, _, err := beginRefund(t, mID, pay, fmt.Sprint("r", i), `{"amount":"10.00"}`)
		require.NoError(t, err)
		ids = append(ids, r.ID)
	}

	var seen []uuid.UUID
	var after *uuid.UUID
	var mores []bool
	for {
		page, more, err := db.PaymentRefunds(ctx, pay, 2, after)
		require.NoError(t, err)
		for _, r := range page {
			require.Equal(t, pay, r.PaymentID)
			seen = append(seen, r.ID)
		}
		mores = append(mores, more)
		if !more {
			break
		}
		after = &page[len(page)-1].ID
	}
	require.Equal(t, []bool{true, true, false}, mores)
	require.Equal(t, []uuid.UUID{ids[4], ids[3], ids[2], ids[1], ids[0]}, seen, "newest first, each once")

	page, more, err := db.PaymentRefunds(ctx, pay, 5, nil)
	require.NoError(t, err)
	require.False(t, more, "exactly a page is no more")
	require.Len(t, page, 5)

	otherRefund, err := db.RefundByKey(ctx, mID, "other")
	require.NoError(t, err)
	for _, bad := range []uuid.UUID{payment.NewID(), otherRefund.ID} {
		_, _, err = db.PaymentRefunds(ctx, pay, 2, &bad)
		var ve *payment.ValidationError
		require.True(t, errors.As(err, &ve), "starting_after %s: %v", bad, err)
		require.Equal(t, "starting_after", ve.Fields[0].Field)
	}
	none, more, err := db.PaymentRefunds(ctx, payment.NewID(), 10, nil)
	require.NoError(t, err)
	require.Empty(t, none)
	require.False(t, more)
}

// Verify finds refunds that contradict their money: a refund marked succeeded by hand, without
// its posting, and a payment whose refunded amount was changed by hand.
func TestVerifyReportsRefundViolations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 100_000})
	key := uuid.NewString()
	_, p, _, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, OperationID: payment.NewID(), Lease: time.Minute,
		Request: payment.Request{InvoiceID: key, AmountMinor: 10_000, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}})
	require.NoError(t, err)
	require.NoError(t, own.Reserve(ctx, p.ID))
	_, err = own.Finalize(ctx, p.ID, "ch")
	require.NoError(t, err)
	req, err := payment.ParseRefundRequest([]byte(`{"amount":"30"}`))
	require.NoError(t, err)
	_, r, _, err := own.BeginRefund(ctx, store.BeginRefundInput{MerchantID: m.ID, PaymentID: p.ID, Key: "k", Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, own.HoldRefund(ctx, r.ID))
	problems, err := own.Verify(ctx)
	require.NoError(t, err)
	require.Empty(t, problems)

	require.NoError(t, own.Exec(ctx, `UPDATE refunds SET status = 'succeeded' WHERE id = $1`, r.ID))
	problems, err = own.Verify(ctx)
	require.NoError(t, err)
	require.Len(t, problems, 4, "%v", problems)
	require.Contains(t, problems[0], "every succeeded refund has exactly one refund posting")
	require.Contains(t, problems[1], "payments' refunded and held amounts are their refunds' sums")
	require.Contains(t, problems[2], "reservations match refund outcomes")
	require.Contains(t, problems[3], "idempotency records follow their refunds")

	own2, err := store.Open(ctx, store.Options{URL: env.OwnDatabase(t), SecretKey: testkit.SecretKey, Migrate: true})
	require.NoError(t, err)
	defer own2.Close()
	m2 := testkit.NewMerchant(t, own2, testkit.MerchantOptions{Deposit: 100_000})
	settled, err := testkit.Settle(ctx, own2, m2, false)
	require.NoError(t, err)
	require.NoError(t, own2.Exec(ctx, `UPDATE payments SET refunded_minor = 1 WHERE id = $1`, settled))
	// A balanced refund posting of no refund: the money moved without one.
	require.NoError(t, own2.Exec(ctx, `WITH p AS (INSERT INTO ledger_postings (id, kind, reference) VALUES (gen_random_uuid(), 'refund', gen_random_uuid()::text) RETURNING id),
e AS (INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
      SELECT gen_random_uuid(), p.id, x.acc, 'TRY', x.amt FROM p,
        (VALUES ((SELECT id FROM accounts WHERE merchant_id = $1 AND kind = 'settlement'), -50::bigint), ($2::uuid, 50::bigint)) x(acc, amt)
      RETURNING account_id, amount_minor),
c AS (UPDATE accounts a SET balance = a.balance + e.amount_minor FROM e WHERE a.id = e.account_id AND a.kind = 'customer')
UPDATE settlement_shards s SET balance = s.balance + e.amount_minor FROM e
WHERE s.account_id = e.account_id AND s.shard = (SELECT min(shard) FROM settlement_shards WHERE account_id = e.account_id)`, m2.ID, m2.Account))
	problems, err = own2.Verify(ctx)
	require.NoError(t, err)
	require.Len(t, problems, 2, "%v", problems)
	require.Contains(t, problems[0], "no other refund has a refund posting")
	require.Contains(t, problems[1], "payments' refunded and held amounts are their refunds' sums")
}

// A refund's events reach the merchant's webhook like a payment's: the inbox finds the merchant
// through the refund.
func TestAcceptRefundEventMakesADelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := webhookMerchant(t, "http://127.0.0.1:9/hook")
	pay := paid(t, mID, aID, 10_000)
	_, r, _, err := beginRefund(t, mID, pay, "k", `{}`)
	require.NoError(t, err)
	require.NoError(t, db.HoldRefund(ctx, r.ID))
	_, err = db.PostRefund(ctx, r.ID, "rf_1")
	require.NoError(t, err)
	var e store.NewDelivery
	require.NoError(t, db.QueryRow(ctx, `SELECT id, aggregate_id, type, created_at FROM outbox WHERE aggregate_id = $1`, []any{r.ID},
		&e.EventID, &e.AggregateID, &e.Type, &e.CreatedAt))
	require.Equal(t, "refund.succeeded", e.Type)
	e.Body = []byte(`{"id":"` + e.EventID.String() + `"}`)
	acc, err := db.AcceptEvent(ctx, "test-refunds", e)
	require.NoError(t, err)
	require.Equal(t, store.AcceptedPending, acc)
	ds, err := db.PaymentDeliveries(ctx, r.ID)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, mID, ds[0].MerchantID)
	require.Equal(t, "refund.succeeded", ds[0].EventType)
}

// A refund key names its refund for good: once its record has expired, the key answers
// idempotency_key_reused, for the same request as for another, and no second refund is held.
func TestExpiredRefundKeyNamesItsRefund(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	pay := paid(t, mID, aID, 10_000)
	_, r, _, err := beginRefund(t, mID, pay, "k", `{"amount":"10.00"}`)
	require.NoError(t, err)
	require.NoError(t, db.HoldRefund(ctx, r.ID))
	_, err = db.PostRefund(ctx, r.ID, "rf_1")
	require.NoError(t, err)
	require.NoError(t, db.Exec(ctx, `DELETE FROM idempotency_records WHERE operation_id = $1`, r.ID))

	for _, body := range []string{`{"amount":"10.00"}`, `{"amount":"20.00"}`} {
		_, _, _, err = beginRefund(t, mID, pay, "k", body)
		require.ErrorIs(t, err, payment.ErrIdempotencyReused, body)
		require.ErrorContains(t, err, r.ID.String(), "the error names the refund the key made")
	}
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM refunds WHERE payment_id = $1`, []any{pay}, &n))
	require.Equal(t, 1, n, "no second refund")
	refunded, held := refundColumns(t, pay)
	require.Equal(t, [2]int64{1_000, 0}, [2]int64{refunded, held}, "nothing held for a second refund")
	_, err = db.RefundRecord(ctx, mID, "k")
	require.ErrorIs(t, err, payment.ErrNotFound, "no record is left behind by the refused request")
	got, err := db.RefundByKey(ctx, mID, "k")
	require.NoError(t, err)
	require.Equal(t, r.ID, got.ID)
}

// A refund's first step follows the payment's rule: a second run of a refund already decided
// holds nothing, while the run that decided it may execute its first step again.
func TestHoldRefusesADecidedRefund(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	pay := paid(t, mID, aID, 10_000)
	_, r, _, err := beginRefund(t, mID, pay, "hold-once", `{"amount":"10.00"}`)
	require.NoError(t, err)
	require.NoError(t, db.HoldRefundRun(ctx, r.ID, "run-1"))
	_, err = db.ReleaseRefund(ctx, r.ID, payment.FailureDeclined)
	require.NoError(t, err)

	var decided *payment.DecidedError
	require.ErrorAs(t, db.HoldRefundRun(ctx, r.ID, "run-2"), &decided, "a failed refund is never held again")
	require.Equal(t, payment.StatusFailed, decided.Status)
	require.NoError(t, db.HoldRefundRun(ctx, r.ID, "run-1"), "the deciding run's step, executed again")
	refunded, held := refundColumns(t, pay)
	require.Equal(t, [2]int64{0, 0}, [2]int64{refunded, held}, "nothing held")
	requireVerified(t)
}

// A refund's payment is checked before its key on every path: here a request under a key that a
// concurrent request is committing (it waits for it, then finds the key taken) is for another
// merchant's payment, which is not found, rather than the key's reuse.
func TestBeginRefundRacedForAnotherMerchantsPayment(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	own := paid(t, mID, aID, 10_000)
	otherM, otherA := fixture(t, 100_000)
	theirs := paid(t, otherM, otherA, 10_000)

	c, err := pgx.Connect(ctx, env.DatabaseURL)
	require.NoError(t, err)
	defer c.Close(ctx)
	tx, err := c.Begin(ctx) // the concurrent request for the merchant's own payment, committing
	require.NoError(t, err)
	req, err := payment.ParseRefundRequest([]byte(`{"amount":"1.00"}`))
	require.NoError(t, err)
	_, err = tx.Exec(ctx, dbsqlc.AcquireRefundKey, mID, "raced", req.Hash(own), payment.NewID(), "1m")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() { _, _, _, err := beginRefund(t, mID, theirs, "raced", `{"amount":"1.00"}`); got <- err }()
	time.Sleep(300 * time.Millisecond) // it waits for the concurrent request at the key
	require.NoError(t, tx.Commit(ctx))
	require.ErrorIs(t, <-got, payment.ErrNotFound)
}

// A refund amount with more digits than the payment's currency is refused (400) under a key seen
// before too, even when it equals that key's amount: the digits are checked before the replay.
func TestRefundTooManyDigitsUnderAnExistingKey(t *testing.T) {
	t.Parallel()
	mID, aID := fixture(t, 10_000)
	pay := paid(t, mID, aID, 5_000)
	_, _, began, err := beginRefund(t, mID, pay, "k-digits", `{"amount": "30"}`)
	require.NoError(t, err)
	require.Equal(t, store.BeganNew, began)
	var ve *payment.ValidationError
	_, _, _, err = beginRefund(t, mID, pay, "k-other", `{"amount": "30.000"}`)
	require.ErrorAs(t, err, &ve, "a new key")
	_, _, began, err = beginRefund(t, mID, pay, "k-digits", `{"amount": "30.000"}`)
	require.ErrorAs(t, err, &ve, "the same amount under the first key (began %v)", began)
	_, _, began, err = beginRefund(t, mID, pay, "k-digits", `{"amount": "30.00"}`)
	require.NoError(t, err)
	require.Equal(t, store.BeganExisting, began, "an equal amount with the currency's digits replays")
}

// A request that found its key taken by a concurrent one, whose record retention then deleted
// before the request could read it (a retention of seconds), is answered as any request under an
// expired refund key: 422 naming the refund the key made, never a 404 or a second refund.
func TestRacedRefundKeyExpiredBeforeItsReadNamesItsRefund(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 100_000})
	req := payment.Request{InvoiceID: "inv", AmountMinor: 10_000, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
	_, p, _, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: "pay", Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, own.Reserve(ctx, p.ID))
	_, err = own.Finalize(ctx, p.ID, "ch_1")
	require.NoError(t, err)

	refund := func() (payment.Refund, store.Began, error) {
		rreq, err := payment.ParseRefundRequest([]byte(`{"amount":"30.00"}`))
		require.NoError(t, err)
		_, r, began, err := own.BeginRefund(ctx, store.BeginRefundInput{MerchantID: m.ID, PaymentID: p.ID, Key: "k", Request: rreq,
			OperationID: payment.NewID(), Lease: time.Minute})
		return r, began, err
	}
	session := func() pgx.Tx { return lockSession(t, url) }
	waiting := func(query string) func() bool { return waitingOn(t, own, query) }
	type result struct {
		r     payment.Refund
		began store.Began
		err   error
	}
	// The first request holds its new record while it waits for the payment's row; the second
	// waits for the first's record; retention's lock is queued behind both.
	payRow := session()
	_, err = payRow.Exec(ctx, `SELECT 1 FROM payments WHERE id = $1 FOR UPDATE`, p.ID)
	require.NoError(t, err)
	first, second := make(chan result, 1), make(chan result, 1)
	go func() { r, b, err := refund(); first <- result{r, b, err} }()
	require.Eventually(t, waiting("%FROM payments WHERE id = $1 AND merchant_id = $2 FOR UPDATE%"), 10*time.Second, 10*time.Millisecond)
	go func() { r, b, err := refund(); second <- result{r, b, err} }()
	require.Eventually(t, waiting("%INSERT INTO idempotency_records%"), 10*time.Second, 10*time.Millisecond)
	retention, locked := queueRetention(t, own, url)

	require.NoError(t, payRow.Rollback(ctx))
	a := <-first
	require.NoError(t, a.err)
	require.Equal(t, store.BeganNew, a.began)
	require.NoError(t, <-locked) // the second found the key taken and ended its transaction
	_, err = retention.Exec(ctx, `DELETE FROM idempotency_records WHERE scope = 'refund' AND idempotency_key = 'k'`)
	require.NoError(t, err)
	require.NoError(t, retention.Commit(ctx))

	b := <-second
	require.ErrorIs(t, b.err, payment.ErrIdempotencyReused, "began %v", b.began)
	require.ErrorContains(t, b.err, a.r.ID.String(), "the error names the refund the key made")
	var n int
	require.NoError(t, own.QueryRow(ctx, `SELECT count(*) FROM refunds WHERE payment_id = $1`, []any{p.ID}, &n))
	require.Equal(t, 1, n, "no second refund")
}

// lockSession is a transaction on a connection of its own to url, rolled back at the test's end.
func lockSession(t *testing.T, url string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(ctx) })
	tx, err := c.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	return tx
}

// waitingOn says whether a statement like query waits for a lock in st's database.
func waitingOn(t *testing.T, st *store.Store, query string) func() bool {
	return func() bool {
		var n int
		require.NoError(t, st.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, []any{query}, &n))
		return n > 0
	}
}

// queueRetention queues, in a session of its own, the lock a deletion of records takes, behind
// the transactions using the table now; locked says when it is held.
func queueRetention(t *testing.T, st *store.Store, url string) (pgx.Tx, <-chan error) {
	t.Helper()
	tx := lockSession(t, url)
	locked := make(chan error, 1)
	go func() {
		_, err := tx.Exec(context.Background(), `LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE`)
		locked <- err
	}()
	require.Eventually(t, waitingOn(t, st, "LOCK TABLE idempotency_records%"), 10*time.Second, 10*time.Millisecond)
	return tx, locked
}
