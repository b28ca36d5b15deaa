package tests

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/kasa-pay/kasa/workflows"
)

// A workflow whose step the database contradicts does not fail and vanish, leaving the payment
// processing with its hold: it flags the payment stuck (counted by kasa_payments_stuck, listed
// as PaymentStatus="stuck") and waits, alive, for an operator's retry signal.
func TestStuckPaymentWaitsForAnOperator(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	s.setFaults(`{"rules":[{"on":"charge","action":"drop_response","count":1}]}`)
	r := s.pay(m, "key-1", payBody("inv-1", "40.00", "TRY", acct))
	require.Equal(t, http.StatusAccepted, r.Status, "%s", r.Body)
	id := mustUUID(t, r.json(t)["id"].(string))

	before, err := db.Stats(ctx)
	require.NoError(t, err)
	// Someone fails the payment behind the workflow's back; then the bank's file says charged.
	_, err = db.Release(ctx, id, "declined")
	require.NoError(t, err)
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "key-1")
	require.NoError(t, tc.SignalWorkflow(ctx, wfID, "", workflows.SignalSettlement,
		workflows.Settlement{Outcome: workflows.OutcomeCharged, ProviderReference: "ch_1"}))

	query := fmt.Sprintf("WorkflowId = '%s' AND PaymentStatus = '%s'", wfID, workflows.StatusStuck)
	listed := func() bool {
		resp, err := tc.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: query})
		return err == nil && len(resp.Executions) == 1
	}
	require.Eventually(t, listed, 20*time.Second, 200*time.Millisecond, "listed as %s", query)
	after, err := db.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, before.Stuck+1, after.Stuck, "kasa_payments_stuck counts it")

	// A retry while the cause is still there finds it stuck again: nothing is guessed.
	require.NoError(t, tc.SignalWorkflow(ctx, wfID, "", workflows.SignalRetry, nil))
	time.Sleep(time.Second)
	require.Eventually(t, listed, 20*time.Second, 200*time.Millisecond)
	desc, err := tc.DescribeWorkflow(ctx, wfID, "")
	require.NoError(t, err)
	require.Equal(t, "Running", desc.RawResponse.WorkflowExecutionInfo.Status.String(), "the workflow waits, it does not fail")
	again, err := db.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, after.Stuck, again.Stuck)
	a := s.account(m, acct)
	require.Equal(t, "100.00", a["balance"], "nothing was captured")
	require.NoError(t, tc.TerminateWorkflow(ctx, wfID, "", "test over"))
}
