package workflows_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	updatepb "go.temporal.io/api/update/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/grpc"

	"github.com/kasa-pay/kasa/payment"
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

// A capture or cancel Temporal did not accept within the caller's wait is unavailable, however
// the poll that follows it goes: an update only admitted (no worker polls the payment's queue)
// is not taken, nor is one Temporal never heard of (unreachable). The poll adds a short wait.
func TestCommandNotAcceptedIsUnavailable(t *testing.T) {
	ctx := context.Background()
	c := devTemporal(t)
	noWorker := workflows.Starter{Client: c, TaskQueue: "no-worker-" + uuid.NewString()}
	merchant := uuid.New()
	in := workflows.InputFor(payment.Payment{ID: payment.NewID(), MerchantID: merchant, AmountMinor: 1_000, Currency: "TRY"})
	_, err := noWorker.StartPayment(ctx, "k", in)
	require.NoError(t, err)
	unreachable, err := client.NewLazyClient(client.Options{HostPort: "127.0.0.1:1", Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(unreachable.Close)

	for name, starter := range map[string]workflows.Starter{
		"no worker polls": noWorker,
		"unreachable":     {Client: unreachable},
	} {
		t.Run(name, func(t *testing.T) {
			for _, update := range []string{workflows.UpdateCapture, workflows.UpdateCancel} {
				wait, cancel := context.WithTimeout(ctx, time.Second)
				began := time.Now()
				_, err := starter.Command(wait, merchant, "k", update, workflows.Command{ID: uuid.New()})
				cancel()
				require.ErrorIs(t, err, payment.ErrUnavailable, update)
				require.NotErrorIs(t, err, workflows.ErrStillRunning, update)
				require.Less(t, time.Since(began), 4*time.Second, "%s: the poll is brief", update)
			}
		})
	}
}

// cutShort is a Temporal that answers a command's update, and its poll, as the server does when
// its long poll ends a moment before the caller's deadline: the wait is cut short (timed out or
// canceled) while the caller's ctx is still alive. accepted says the update was taken first (its
// result's wait is cut), else its acceptance's wait is cut; poll answers the poll after it.
type cutShort struct {
	client.Client
	accepted bool
	poll     *pollAnswer
}

var errCut = client.NewWorkflowUpdateServiceTimeoutOrCanceledError(serviceerror.NewCanceled("stream terminated by RST_STREAM with error code: CANCEL"))

func (c cutShort) UpdateWorkflow(context.Context, client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	if c.accepted {
		return cutHandle{}, nil
	}
	return nil, errCut
}

func (c cutShort) WorkflowService() workflowservice.WorkflowServiceClient { return c.poll }

type cutHandle struct{ answered }

func (cutHandle) Get(context.Context, any) error { return errCut }

// pollAnswer answers PollWorkflowExecutionUpdate with resp or err, and keeps the request.
type pollAnswer struct {
	workflowservice.WorkflowServiceClient
	resp *workflowservice.PollWorkflowExecutionUpdateResponse
	err  error
	req  *workflowservice.PollWorkflowExecutionUpdateRequest
}

func (p *pollAnswer) PollWorkflowExecutionUpdate(_ context.Context, req *workflowservice.PollWorkflowExecutionUpdateRequest, _ ...grpc.CallOption) (*workflowservice.PollWorkflowExecutionUpdateResponse, error) {
	p.req = req
	return p.resp, p.err
}

// A command whose wait Temporal cut short a moment before the caller's deadline is answered as
// one whose wait ended: taken, it is in flight (ErrStillRunning), never a raw error the API would
// answer 503; not yet known as taken, Temporal is asked once whether it took it, and only one it
// did not take is unavailable.
func TestCommandWaitCutShort(t *testing.T) {
	stage := func(s enumspb.UpdateWorkflowExecutionLifecycleStage, o *updatepb.Outcome) *workflowservice.PollWorkflowExecutionUpdateResponse {
		return &workflowservice.PollWorkflowExecutionUpdateResponse{Stage: s, Outcome: o}
	}
	succeeded, err := converter.GetDefaultDataConverter().ToPayloads("succeeded")
	require.NoError(t, err)
	refused := temporal.GetDefaultFailureConverter().ErrorToFailure(
		temporal.NewApplicationError("the payment is canceled, not waiting for a capture", workflows.ErrTypeNotCapturable, "canceled"))
	for _, c := range []struct {
		name     string
		accepted bool
		poll     pollAnswer
		status   string
		err      error
	}{
		{name: "taken, its result's wait cut", accepted: true, err: workflows.ErrStillRunning},
		{name: "the poll finds it taken", poll: pollAnswer{resp: stage(enumspb.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ACCEPTED, nil)},
			err: workflows.ErrStillRunning},
		{name: "the poll finds it done", poll: pollAnswer{resp: stage(enumspb.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_COMPLETED,
			&updatepb.Outcome{Value: &updatepb.Outcome_Success{Success: succeeded}})}, status: "succeeded"},
		{name: "the poll finds it refused", poll: pollAnswer{resp: stage(enumspb.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_COMPLETED,
			&updatepb.Outcome{Value: &updatepb.Outcome_Failure{Failure: refused}})}, err: payment.ErrNotCapturable},
		{name: "the poll finds it only admitted", poll: pollAnswer{resp: stage(enumspb.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED, nil)},
			err: payment.ErrUnavailable},
		{name: "the poll finds none", poll: pollAnswer{err: serviceerror.NewNotFound("update not found")}, err: payment.ErrUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			merchant, id := uuid.New(), uuid.New()
			starter := workflows.Starter{Client: cutShort{accepted: c.accepted, poll: &c.poll}, Namespace: "payments"}
			status, err := starter.Command(context.Background(), merchant, "k", workflows.UpdateCapture, workflows.Command{ID: id})
			require.ErrorIs(t, err, c.err)
			require.Equal(t, c.status, status)
			if c.accepted {
				require.Nil(t, c.poll.req, "a taken command is not polled")
				return
			}
			require.NotNil(t, c.poll.req, "asked once")
			require.Equal(t, "payments", c.poll.req.GetNamespace())
			require.Equal(t, workflows.PaymentWorkflowID(merchant, "k"), c.poll.req.GetUpdateRef().GetWorkflowExecution().GetWorkflowId())
			require.Equal(t, id.String(), c.poll.req.GetUpdateRef().GetUpdateId(), "the command's id is its update's")
			require.Equal(t, enumspb.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ACCEPTED, c.poll.req.GetWaitPolicy().GetLifecycleStage())
		})
	}
}

// A settlement whose wait for its answer Temporal cut short a moment before the caller's deadline
// was taken (accepted): it is in flight (ErrStillRunning, as when the deadline itself ends the
// wait), never a raw error that a reconciliation import would report as a failed settlement.
func TestSettleWaitCutShortIsStillRunning(t *testing.T) {
	_, err := workflows.Starter{Client: cutShort{accepted: true}}.Settle(context.Background(), "payment/x/k",
		workflows.Settlement{Outcome: workflows.OutcomeCharged})
	require.ErrorIs(t, err, workflows.ErrStillRunning)
}

// cutAfterAccept is a Temporal that takes an update and then cuts the wait for its result short
// with err, while the caller's ctx is still alive.
type cutAfterAccept struct {
	client.Client
	err error
}

func (c cutAfterAccept) UpdateWorkflow(context.Context, client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	return failingHandle{err: c.err}, nil
}

type failingHandle struct {
	answered
	err error
}

func (h failingHandle) Get(context.Context, any) error { return h.err }

// A settlement its workflow took, whose result's wait Temporal cut short a moment before the
// import's deadline, is still being applied (ErrStillRunning: the import reports it settling), as
// when the deadline itself ended the wait: never a failed settlement, nor, when the cut reads as
// a deadline, an unavailable Temporal that aborts the whole import.
func TestSettleWaitCutShort(t *testing.T) {
	for name, cause := range map[string]error{
		"canceled": serviceerror.NewCanceled("stream terminated by RST_STREAM with error code: CANCEL"),
		"deadline": serviceerror.NewDeadlineExceeded("context deadline exceeded"),
	} {
		t.Run(name, func(t *testing.T) {
			starter := workflows.Starter{Client: cutAfterAccept{err: client.NewWorkflowUpdateServiceTimeoutOrCanceledError(cause)}}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			status, err := starter.Settle(ctx, "payment/x/k", workflows.Settlement{Outcome: workflows.OutcomeCharged})
			require.ErrorIs(t, err, workflows.ErrStillRunning)
			require.False(t, workflows.IsUnavailable(err), "never read as Temporal away")
			require.Empty(t, status)
		})
	}
}
