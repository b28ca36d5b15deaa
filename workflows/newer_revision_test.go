package workflows_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/workflows"
)

// In a rolling upgrade a new API may start a payment or refund under rules newer than a worker
// of the previous release knows (a higher Revision). That worker must not run it by its own,
// older rules: it fails the workflow task, which Temporal retries until a worker that knows the
// revision takes it, and nothing is held, sent or written meanwhile.
func TestNewerRevisionWaitsForAWorkerThatKnowsIt(t *testing.T) {
	ctx := context.Background()
	c := devTemporal(t)
	fake := &fakeRefundSteps{calls: map[string]int{}, policy: workflows.ChargePolicy{Capability: workflows.CapabilityIdempotent},
		send: func(in workflows.SendRefundInput) (workflows.RefundSendResult, error) {
			return workflows.RefundSendResult{ProviderReference: "rf_1", Succeeded: true}, nil
		}}
	queue := "newer-" + uuid.NewString()
	w := worker.New(c, queue, worker.Options{})
	w.RegisterWorkflowWithOptions(workflows.PaymentWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowPayment})
	w.RegisterWorkflowWithOptions(workflows.RefundWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowRefund})
	fake.register(w)
	for _, name := range []string{workflows.ActivityReserve, workflows.ActivityReserveFunds} {
		w.RegisterActivityWithOptions(func(context.Context, uuid.UUID) error { fake.count(name); return nil }, activity.RegisterOptions{Name: name})
	}
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)
	starter := workflows.Starter{Client: c, TaskQueue: queue}
	merchant := uuid.New()

	for _, tc := range []struct {
		name  string
		start func() (string, error)
		id    string
	}{
		{
			name: "payment",
			start: func() (string, error) {
				in := workflows.InputFor(payment.Payment{ID: payment.NewID(), MerchantID: merchant, AmountMinor: 1_000, Currency: "TRY"})
				in.Revision = workflows.CurrentRevision + 1
				return starter.StartPayment(ctx, "p", in)
			},
			id: workflows.PaymentWorkflowID(merchant, "p"),
		},
		{
			name: "refund",
			start: func() (string, error) {
				in := workflows.RefundInputFor(payment.Refund{ID: payment.NewID(), PaymentID: paymentID, MerchantID: merchant, AmountMinor: 1_000, Currency: "TRY"})
				in.Revision = workflows.CurrentRevision + 1
				return starter.StartRefund(ctx, "r", in)
			},
			id: workflows.RefundWorkflowID(merchant, "r"),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.start()
			require.NoError(t, err)
			var failure string
			require.Eventually(t, func() bool {
				failure = taskFailure(ctx, c, tc.id)
				return failure != ""
			}, 20*time.Second, 100*time.Millisecond, "the worker fails the workflow task")
			require.Contains(t, failure, "Revision")
			d, err := c.DescribeWorkflow(ctx, tc.id, "")
			require.NoError(t, err)
			require.Equal(t, enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, d.Status, "open, for a newer worker")
		})
	}
	require.Empty(t, fake.counts(), "no step of either ran")
}

// taskFailure is the message of a run's first failed workflow task; "" while none failed.
func taskFailure(ctx context.Context, c client.Client, id string) string {
	it := c.GetWorkflowHistory(ctx, id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return ""
		}
		if a := e.GetWorkflowTaskFailedEventAttributes(); a != nil {
			return strings.TrimSpace(a.GetFailure().GetMessage())
		}
	}
	return ""
}
