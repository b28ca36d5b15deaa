package tests

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/workflows"
)

// postingsOf counts the ledger postings of kind for an operation.
func postingsOf(t *testing.T, kind, ref string) int {
	t.Helper()
	return countRows(t, `SELECT count(*) FROM ledger_postings WHERE kind = $1 AND reference = $2`, kind, ref)
}

// Two partial refunds of one payment, both unknown: the simulator's own file lists the one the
// bank paid back and not the other. The import posts the first and releases the second, the
// payer gets exactly the listed amount back, and what is left is refundable again at the bank too.
func TestReconcilePartialRefundsFromTheBanksFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	r := s.pay(m, "pr", payBody("inv-pr", "40.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	pid := r.json(t)["id"].(string)

	s.setFaults(`{"rules":[{"on":"refund","action":"drop_response","count":1}]}`)
	a := s.refund(m, pid, "ra", `{"amount":"15.00"}`)
	require.Equal(t, http.StatusAccepted, a.Status, "%s", a.Body)
	s.setFaults(`{"rules":[{"on":"refund","action":"error_429","count":1}]}`)
	b := s.refund(m, pid, "rb", `{"amount":"10.00"}`)
	require.Equal(t, http.StatusAccepted, b.Status, "%s", b.Body)
	aID, bID := a.json(t)["id"].(string), b.json(t)["id"].(string)
	require.Eventually(t, func() bool {
		ra, _ := db.Refund(ctx, mustUUID(t, aID))
		rb, _ := db.Refund(ctx, mustUUID(t, bID))
		return ra.Status == payment.StatusUnknown && rb.Status == payment.StatusUnknown
	}, 20*time.Second, 50*time.Millisecond)
	time.Sleep(bookingWindow + 200*time.Millisecond)
	file := s.settlementFile(today())
	rep, ok := decodeReport(t, s.importSettlements(m, file))
	require.True(t, ok, "%+v %+v", rep.Mismatches, rep.RefundMismatches)
	require.Equal(t, reconcile.Counts{Matched: 1, RefundResolvedCharged: 1, RefundResolvedNotCharged: 1}, rep.Counts)
	ra, _ := db.Refund(ctx, mustUUID(t, aID))
	rb, _ := db.Refund(ctx, mustUUID(t, bID))
	require.Equal(t, payment.StatusSucceeded, ra.Status)
	require.Equal(t, payment.StatusFailed, rb.Status)
	require.Equal(t, "75.00", s.account(m, acct)["balance"])
	require.Equal(t, int64(1500), paymentByKey(t, m, "pr").AmountRefunded)
	requireVerified(t)
	c := s.refund(m, pid, "rc", `{"amount":"25.00"}`)
	require.Equal(t, http.StatusCreated, c.Status, "%s", c.Body)
	again, ok := decodeReport(t, s.importSettlements(m, s.settlementFile(today())))
	require.True(t, ok, "%+v", again.RefundMismatches)
	require.Equal(t, reconcile.Counts{Matched: 1, RefundMatched: 2}, again.Counts, "the settled refund and the new one are listed")
	requireVerified(t)
}

// Imports of one file running at once settle each unknown payment and refund once: the ledger
// posts once, every hold goes, and no import reports a mismatch for what another one settled.
func TestReconcileConcurrentImportsOfPaymentsAndRefunds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "500.00")
	r := s.pay(m, "base", payBody("inv-base", "100.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	pid := r.json(t)["id"].(string)
	listed := s.payUnknown(m, "listed", payBody("inv-l", "20.00", "TRY", acct), "drop_response")
	unlisted := s.payUnknown(m, "unlisted", payBody("inv-u", "30.00", "TRY", acct), "error_429")
	s.setFaults(`{"rules":[{"on":"refund","action":"drop_response","count":1}]}`)
	a := s.refund(m, pid, "ra", `{"amount":"15.00"}`)
	require.Equal(t, http.StatusAccepted, a.Status, "%s", a.Body)
	s.setFaults(`{"rules":[{"on":"refund","action":"error_429","count":1}]}`)
	b := s.refund(m, pid, "rb", `{"amount":"10.00"}`)
	require.Equal(t, http.StatusAccepted, b.Status, "%s", b.Body)
	aID, bID := a.json(t)["id"].(string), b.json(t)["id"].(string)
	require.Eventually(t, func() bool {
		ra, _ := db.Refund(ctx, mustUUID(t, aID))
		rb, _ := db.Refund(ctx, mustUUID(t, bID))
		return ra.Status == payment.StatusUnknown && rb.Status == payment.StatusUnknown
	}, 20*time.Second, 50*time.Millisecond)
	time.Sleep(bookingWindow + 200*time.Millisecond)
	file := s.settlementFile(today())
	var wg sync.WaitGroup
	reps := make([]response, 3)
	for i := range reps {
		wg.Go(func() { reps[i] = s.importSettlements(m, file) })
	}
	wg.Wait()
	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "listed").Status)
	require.Equal(t, payment.StatusFailed, paymentByKey(t, m, "unlisted").Status)
	require.Equal(t, 1, postingsOf(t, "payment", listed.ID.String()))
	require.Zero(t, postingsOf(t, "payment", unlisted.ID.String()))
	require.Equal(t, 1, postingsOf(t, "refund", aID))
	require.Zero(t, postingsOf(t, "refund", bID))
	require.Zero(t, reserved(t, acct))
	require.Equal(t, "395.00", s.account(m, acct)["balance"])
	requireVerified(t)
	for i, r := range reps {
		rep, ok := decodeReport(t, r)
		require.True(t, ok, "import %d: %+v %+v", i, rep.Mismatches, rep.RefundMismatches)
	}
}
