package tests

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/workflows"
)

// A settlement sent twice, or for a payment that is not unknown, has no second effect, and its
// sender gets a clear rejection.
func TestSettlementIsChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	starter := workflows.Starter{Client: tc, TaskQueue: s.queue}

	ok := s.pay(m, "paid", payBody("inv-0", "10.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, ok.Status)
	_, err := starter.Settle(ctx, workflows.PaymentWorkflowID(mustUUID(t, m.ID), "paid"), workflows.Settlement{Outcome: workflows.OutcomeNotCharged})
	require.ErrorIs(t, err, workflows.ErrSettlementRejected, "a succeeded payment cannot be settled again")

	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	r := s.pay(m, "k", payBody("inv-1", "40.00", "TRY", acct))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "k")

	_, err = starter.Settle(ctx, wfID, workflows.Settlement{Outcome: "maybe"})
	require.ErrorIs(t, err, workflows.ErrSettlementRejected)
	require.ErrorContains(t, err, "outcome must be")
	require.Equal(t, "40.00", s.account(m, acct)["reserved"], "a rejected settlement changes nothing")

	status, err := starter.Settle(ctx, wfID, workflows.Settlement{Outcome: workflows.OutcomeNotCharged, Note: "not in the bank's file"})
	require.NoError(t, err)
	require.Equal(t, "failed", status)

	_, err = starter.Settle(ctx, wfID, workflows.Settlement{Outcome: workflows.OutcomeCharged})
	require.ErrorIs(t, err, workflows.ErrSettlementRejected, "settled twice")
	require.Error(t, tc.SignalWorkflow(ctx, wfID, "", workflows.SignalSettlement, workflows.Settlement{Outcome: workflows.OutcomeCharged}),
		"a late signal is refused by Temporal: the workflow is closed")

	a := s.account(m, acct)
	require.Equal(t, "90.00", a["balance"], "released: only the first payment moved money")
	require.Equal(t, "0.00", a["reserved"])
	final := s.pay(m, "k", payBody("inv-1", "40.00", "TRY", acct))
	require.Equal(t, http.StatusPaymentRequired, final.Status)
	requireVerified(t)
}

// With inquiry, a not_charged settlement that reaches an unknown payment between two of its
// inquiries is checked with the bank before it is applied: the bank, answering again, holds the
// charge, so the hold is kept for an operator and no money the bank took is released. The
// charged settlement the operator then sends books it once.
func TestNotChargedBetweenInquiriesMeetsTheBanksCharge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityInquiry)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	starter := workflows.Starter{Client: tc, TaskQueue: s.queue}
	// The charge's answer is lost and the bank answers no inquiry: parked unknown.
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1},{"on":"inquiry","action":"error_503"}]}`)
	r := s.pay(m, "between", payBody("inv-between", "40.00", "TRY", acct))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	var p payment.Payment
	require.Eventually(t, func() bool { p = paymentByKey(t, m, "between"); return p.Status == payment.StatusUnknown },
		60*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, s.simCount(p.ID.String()), "the bank holds the charge")
	s.setFaults(`{"rules":[]}`) // the bank answers again

	// The parked run's first inquiry is two seconds away; a wrong file says not charged now.
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "between")
	_, err := starter.Settle(ctx, wfID, workflows.Settlement{Outcome: workflows.OutcomeNotCharged, Note: "not in the file"})
	require.ErrorIs(t, err, workflows.ErrSettlementRejected)
	require.ErrorContains(t, err, "contradicts the bank")
	p = paymentByKey(t, m, "between")
	require.Equal(t, payment.StatusUnknown, p.Status, "not released")
	require.Contains(t, p.StuckReason, "contradicts the bank")
	require.Equal(t, "40.00", s.account(m, acct)["reserved"], "the hold is kept")

	status, err := starter.Settle(ctx, wfID, workflows.Settlement{Outcome: workflows.OutcomeCharged, Note: "the bank's statement"})
	require.NoError(t, err)
	require.Equal(t, "succeeded", status)
	a := s.account(m, acct)
	require.Equal(t, []any{"60.00", "0.00"}, []any{a["balance"], a["reserved"]})
	require.Equal(t, 1, s.simCount(p.ID.String()), "charged once")
	requireVerified(t)
}

// With inquiry, at a bank whose inquiry endpoint fails for as long as kasa asks, one import of
// the bank's file settles every unknown payment and refund it covers: the settlement each waits
// for an inquiry that gives up within one attempt's timeout (Revision 12), well inside the
// import's wait, where before it waited for the whole charge budget, longer than the import
// waits, and the import reported it settling. The stack keeps production's order: charge timeout
// (6 s) < the import's wait (12 s) < charge budget (20 s).
func TestOneImportSettlesWhileTheBankAnswersNoInquiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStackWith(t, stackOptions{capability: workflows.CapabilityInquiry, temporal: tc, bookingWindow: bookingWindow,
		chargeBudget: 20 * time.Second, chargeTimeout: 6 * time.Second, settleTimeout: 12 * time.Second, syncWait: time.Second})
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	r := s.pay(m, "paid", payBody("inv-paid", "50.00", "TRY", acct))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	paid := r.json(t)["id"].(string)

	// Each send's answer is lost (drop_response: the bank moved the money; error_500: it did not),
	// and the bank answers no inquiry from then on.
	const noInquiry = `{"on":"inquiry","action":"error_503"}`
	lost := func(on, action string, send func() response) string {
		t.Helper()
		s.setFaults(`{"rules":[{"on":"` + on + `","action":"` + action + `","count":1},` + noInquiry + `]}`)
		r := send()
		require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
		require.Eventually(t, func() bool { return bankFaultsLeft(t, s.sim.URL) == 0 }, 10*time.Second, 20*time.Millisecond,
			"the send reached the bank")
		return r.json(t)["id"].(string)
	}
	charged := lost("charge", "drop_response", func() response { return s.pay(m, "charged", payBody("charged", "20.00", "TRY", acct)) })
	notCharged := lost("charge", "error_500", func() response { return s.pay(m, "not-charged", payBody("not-charged", "20.00", "TRY", acct)) })
	refunded := lost("refund", "drop_response", func() response { return s.refund(m, paid, "refunded", `{"amount":"5.00"}`) })
	notRefunded := lost("refund", "error_500", func() response { return s.refund(m, paid, "not-refunded", `{"amount":"5.00"}`) })
	require.Eventually(t, func() bool {
		for _, key := range []string{"charged", "not-charged"} {
			if paymentByKey(t, m, key).Status != payment.StatusUnknown {
				return false
			}
		}
		for _, id := range []string{refunded, notRefunded} {
			if rf, err := db.Refund(ctx, mustUUID(t, id)); err != nil || rf.Status != payment.StatusUnknown {
				return false
			}
		}
		return true
	}, 60*time.Second, 100*time.Millisecond, "parked unknown once the charge budget's inquiries gave up")
	require.Equal(t, 1, s.simCount(charged))
	require.Zero(t, s.simCount(notCharged))
	require.Equal(t, 1, s.simRefunds(refunded))
	require.Zero(t, s.simRefunds(notRefunded))
	a := s.account(m, acct)
	require.Equal(t, []any{"50.00", "40.00"}, []any{a["balance"], a["reserved"]}, "both unknown payments keep their holds")

	time.Sleep(bookingWindow + 100*time.Millisecond)
	rep, ok := decodeReport(t, s.importSettlements(m, s.settlementFile(today())))
	require.True(t, ok, "%+v %+v", rep.Mismatches, rep.RefundMismatches)
	require.Empty(t, rep.Pending, "none left settling")
	require.Empty(t, rep.RefundPending, "none left settling")
	require.Equal(t, reconcile.Counts{Matched: 1, ResolvedCharged: 1, ResolvedNotCharged: 1,
		RefundResolvedCharged: 1, RefundResolvedNotCharged: 1}, rep.Counts)

	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "charged").Status)
	require.Equal(t, payment.StatusFailed, paymentByKey(t, m, "not-charged").Status)
	for id, want := range map[string]payment.Status{refunded: payment.StatusSucceeded, notRefunded: payment.StatusFailed} {
		got, err := db.Refund(ctx, mustUUID(t, id))
		require.NoError(t, err)
		require.Equal(t, want, got.Status)
	}
	a = s.account(m, acct)
	require.Equal(t, []any{"35.00", "0.00"}, []any{a["balance"], a["reserved"]}, "100 - 50 - 20 + 5: every hold gone")
	require.Equal(t, int64(500), paymentByKey(t, m, "paid").AmountRefunded)
	require.Equal(t, refundState{Refunded: 500, Balance: 6500, Refunds: 2, Settled: 1, Postings: 1, Succeeded: 1, Failed: 1},
		readRefundState(t, env.DatabaseURL, paid), "the refund's holds: posted once, the other given back")
	require.Equal(t, 1, postingsOf(t, "payment", charged))
	require.Zero(t, postingsOf(t, "payment", notCharged))
	require.Equal(t, 1, postingsOf(t, "refund", refunded))
	require.Zero(t, postingsOf(t, "refund", notRefunded))
	require.Equal(t, 1, s.simCount(charged), "settling never charges again")
	require.Zero(t, s.simCount(notCharged))
	require.Equal(t, 1, s.simRefunds(refunded))
	require.Zero(t, s.simRefunds(notRefunded))
	requireVerified(t)
}
