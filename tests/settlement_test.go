package tests

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
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
