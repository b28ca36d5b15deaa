package tests

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/workflows"
)

// listedUnknown counts the runs of wfID the operator's list of unknown payments shows.
func listedUnknown(t *testing.T, wfID string) int {
	t.Helper()
	query := fmt.Sprintf("%s AND WorkflowId = '%s'", workflows.UnknownList, wfID)
	resp, err := tc.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Query: query})
	require.NoError(t, err, query)
	return len(resp.Executions)
}

// The operator's list of unknown payments (docs/reconciliation.md) shows a payment once while it
// waits for its settlement, and no longer once it is settled: a run that closed keeps its last
// PaymentStatus, so the run an operator terminated by mistake, brought back by the documented
// reset, must not stay listed as unknown beside its payment, nor after it.
func TestUnknownListShowsEachWaitingPaymentOnce(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	p := s.payUnknown(m, "listed-unknown", payBody("inv-listed-unknown", "40.00", "TRY", acct), "drop_response")
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "listed-unknown")
	require.Eventually(t, func() bool { return listedUnknown(t, wfID) == 1 }, 20*time.Second, 200*time.Millisecond,
		"the unknown payment is listed")

	terminateByMistake(t, wfID)
	resetToLastWorkflowTask(t, wfID)
	require.Eventually(t, func() bool { return waitingForSettlement(t, m, "listed-unknown") }, 10*time.Second, 100*time.Millisecond)
	time.Sleep(2 * time.Second) // visibility is eventually consistent: let a second row show, if any
	require.Equal(t, 1, listedUnknown(t, wfID), "the payment is listed once, by the run that waits")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	status, err := workflows.Starter{Client: tc, TaskQueue: s.queue}.Settle(ctx, wfID,
		workflows.Settlement{Outcome: workflows.OutcomeCharged, OperationID: p.ID, Note: "bank ticket"})
	require.NoError(t, err)
	require.Equal(t, "succeeded", status)
	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "listed-unknown").Status)
	require.Eventually(t, func() bool { return listedUnknown(t, wfID) == 0 }, 20*time.Second, 200*time.Millisecond,
		"a settled payment leaves the list of unknown payments")
	require.Equal(t, 1, s.simCount(p.ID.String()), "the bank charged once")
	requireVerified(t)
}

// temporalCLI runs the temporal CLI against the tests' Temporal, as an operator types it.
func temporalCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cli, err := devenv.FindTemporalCLI()
	require.NoError(t, err)
	out, err := exec.Command(cli, append(args, "--address", env.TemporalAddress, "--namespace", "default")...).CombinedOutput()
	return string(out), err
}

// The commands docs/reconciliation.md gives an operator, as written there: find the unknown
// payment, read its status, settle it with the checked update, which answers with the final
// status, and see a second settlement refused with its reason.
func TestReconciliationRunbookCommands(t *testing.T) {
	t.Parallel()
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	acct := s.newAccount(m, "TRY", "100.00")
	p := s.payUnknown(m, "runbook", payBody("inv-runbook", "40.00", "TRY", acct), "drop_response")
	wfID := workflows.PaymentWorkflowID(mustUUID(t, m.ID), "runbook")

	require.Eventually(t, func() bool {
		out, err := temporalCLI(t, "workflow", "list", "--query", workflows.UnknownList+` AND MerchantId="`+m.ID+`"`)
		return err == nil && strings.Contains(out, wfID)
	}, 20*time.Second, 200*time.Millisecond, "temporal workflow list finds it")
	out, err := temporalCLI(t, "workflow", "query", "--workflow-id", wfID, "--name", "status")
	require.NoError(t, err, out)
	require.Contains(t, out, `"unknown"`)

	settle := `{"outcome":"charged","provider_reference":"ch_ticket","operation_id":"` + p.ID.String() + `","note":"bank ticket 1234"}`
	out, err = temporalCLI(t, "workflow", "update", "execute", "--workflow-id", wfID, "--name", "settle", "--input", settle)
	require.NoError(t, err, out)
	require.Contains(t, out, "succeeded")
	got := paymentByKey(t, m, "runbook")
	require.Equal(t, payment.StatusSucceeded, got.Status)
	require.Equal(t, "ch_ticket", got.ProviderReference)
	a := s.account(m, acct)
	require.Equal(t, []any{"60.00", "0.00"}, []any{a["balance"], a["reserved"]})

	out, err = temporalCLI(t, "workflow", "update", "execute", "--workflow-id", wfID, "--name", "settle",
		"--input", `{"outcome":"not_charged","operation_id":"`+p.ID.String()+`","note":"again"}`)
	require.Error(t, err, "a second settlement is refused: %s", out)
	require.Contains(t, out, "workflow execution already completed")
	require.Equal(t, payment.StatusSucceeded, paymentByKey(t, m, "runbook").Status)
	require.Eventually(t, func() bool { return listedUnknown(t, wfID) == 0 }, 20*time.Second, 200*time.Millisecond)
	requireVerified(t)
}
