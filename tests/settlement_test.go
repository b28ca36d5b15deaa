package tests

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

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
