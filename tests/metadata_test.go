package tests

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	sdkpb "go.temporal.io/api/sdk/v1"

	"github.com/kasa-pay/kasa/workflows"
)

// operatorView is what the Web UI shows of a workflow: its static summary and details, and its
// current details.
func operatorView(t *testing.T, workflowID string) (summary, details, current string) {
	t.Helper()
	ctx := context.Background()
	d, err := tc.DescribeWorkflow(ctx, workflowID, "")
	require.NoError(t, err)
	summary, err = d.GetStaticSummary()
	require.NoError(t, err)
	details, err = d.GetStaticDetails()
	require.NoError(t, err)
	v, err := tc.QueryWorkflow(ctx, workflowID, "", "__temporal_workflow_metadata")
	require.NoError(t, err)
	var md sdkpb.WorkflowMetadata
	require.NoError(t, v.Get(&md))
	return summary, details, md.GetCurrentDetails()
}

// An operator reads in the Web UI what a payment is and what it waits for: an unknown payment's
// amount, invoice and merchant, and that it waits for a settlement; an authorization's deadline.
func TestWorkflowsTellOperatorsWhatIsAtStake(t *testing.T) {
	s := newStack(t, workflows.CapabilityNone)
	m := s.newMerchant()
	payer := s.newAccount(m, "TRY", "100.00")
	p := s.payUnknown(m, "meta-unknown", payBody("inv-meta-1", "12.34", "TRY", payer), "drop_response")
	summary, details, current := operatorView(t, workflows.PaymentWorkflowID(mustUUID(t, m.ID), "meta-unknown"))
	require.Equal(t, "payment 12.34 TRY · invoice inv-meta-1 · merchant "+m.ID, summary)
	require.Contains(t, details, p.ID.String())
	require.Contains(t, details, payer)
	require.Contains(t, current, "unknown")
	require.Contains(t, current, "settle")

	r := s.pay(m, "meta-manual", manualBody("inv-meta-2", "5.00", payer))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	summary, _, current = operatorView(t, workflows.PaymentWorkflowID(mustUUID(t, m.ID), "meta-manual"))
	require.Contains(t, summary, "payment 5.00 TRY · invoice inv-meta-2 · authorize, capture later")
	require.Contains(t, current, "waiting for a capture or a cancel until "+r.json(t)["capture_before"].(string)[:19])
}
