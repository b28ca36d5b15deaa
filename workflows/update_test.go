package workflows_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/kasa-pay/kasa/workflows"
)

// taskFailedOnce is a Temporal whose first update of a workflow meets a workflow task that
// failed as it carried the update (a timer fired as it ran: the server failed the task to take
// it), as the server answers then; the update sent again is taken and answers status.
// With ended set, the run has closed by then, with that status.
type taskFailedOnce struct {
	client.Client
	status string
	ended  string
	calls  int
}

func (c *taskFailedOnce) UpdateWorkflow(context.Context, client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	c.calls++
	switch {
	case c.calls == 1:
		return nil, serviceerror.NewWorkflowNotReady("Unable to perform workflow execution update due to unexpected workflow task failure.")
	case c.ended != "":
		return nil, serviceerror.NewNotFound("workflow execution already completed")
	}
	return answered(c.status), nil
}

func (c *taskFailedOnce) GetWorkflow(context.Context, string, string) client.WorkflowRun {
	return closedRun{status: c.ended}
}

// closedRun is a run that ended with status.
type closedRun struct {
	client.WorkflowRun
	status string
}

func (r closedRun) Get(_ context.Context, v any) error {
	v.(*workflows.PaymentResult).Status = r.status
	return nil
}

// answered is an update's handle that answers a status.
type answered string

func (answered) WorkflowID() string { return "" }
func (answered) RunID() string      { return "" }
func (answered) UpdateID() string   { return "" }
func (a answered) Get(_ context.Context, v any) error {
	*v.(*string) = string(a)
	return nil
}

// An update that meets a failed workflow task was not taken (Temporal answers WorkflowNotReady):
// an operator's settlement, a reconciliation import's and a merchant's capture or cancel are
// sent again, not refused with Temporal's words. A parked run's timers make the meeting likely.
func TestUpdatesMeetingAFailedWorkflowTaskAreSentAgain(t *testing.T) {
	ctx := context.Background()
	t.Run("settle", func(t *testing.T) {
		c := &taskFailedOnce{status: "succeeded"}
		status, err := workflows.Starter{Client: c}.Settle(ctx, "payment/x/k", workflows.Settlement{Outcome: workflows.OutcomeCharged})
		require.NoError(t, err)
		require.Equal(t, "succeeded", status)
		require.Equal(t, 2, c.calls)
	})
	// The failed task may have applied the settlement (a local activity's write stays) and the
	// run, finding its payment final, ended: a settlement its run ended as answers that status.
	t.Run("settle, the run ended as it says", func(t *testing.T) {
		c := &taskFailedOnce{ended: "succeeded"}
		status, err := workflows.Starter{Client: c}.Settle(ctx, "payment/x/k", workflows.Settlement{Outcome: workflows.OutcomeCharged})
		require.NoError(t, err)
		require.Equal(t, "succeeded", status)
	})
	t.Run("settle, the run ended otherwise", func(t *testing.T) {
		c := &taskFailedOnce{ended: "failed"}
		_, err := workflows.Starter{Client: c}.Settle(ctx, "payment/x/k", workflows.Settlement{Outcome: workflows.OutcomeCharged})
		require.ErrorIs(t, err, workflows.ErrSettlementRejected)
	})
	t.Run("capture", func(t *testing.T) {
		c := &taskFailedOnce{status: "succeeded"}
		status, err := workflows.Starter{Client: c}.Command(ctx, uuid.New(), "k", workflows.UpdateCapture, workflows.Command{ID: uuid.New()})
		require.NoError(t, err)
		require.Equal(t, "succeeded", status)
		require.Equal(t, 2, c.calls)
	})
}

// cutShort is a Temporal that takes a command's update and then cuts the wait for its result
// short, as the server does when its long poll ends a moment before the caller's deadline: timed
// out or canceled while the caller's ctx is still alive.
type cutShort struct{ client.Client }

var errCut = client.NewWorkflowUpdateServiceTimeoutOrCanceledError(serviceerror.NewCanceled("stream terminated by RST_STREAM with error code: CANCEL"))

func (cutShort) UpdateWorkflow(context.Context, client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	return cutHandle{}, nil
}

type cutHandle struct{ answered }

func (cutHandle) Get(context.Context, any) error { return errCut }

// A command Temporal took, whose result's wait Temporal cut short a moment before the caller's
// deadline, is in flight (ErrStillRunning), as when the deadline itself ended the wait: never a
// raw error, which the API answers 503 as if nothing had been taken.
func TestCommandWaitCutShort(t *testing.T) {
	status, err := workflows.Starter{Client: cutShort{}}.Command(context.Background(), uuid.New(), "k", workflows.UpdateCapture, workflows.Command{ID: uuid.New()})
	require.ErrorIs(t, err, workflows.ErrStillRunning)
	require.Empty(t, status)
}
