package workflows

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
)

// ErrStillRunning: the workflow did not finish within the caller's wait.
var ErrStillRunning = errors.New("workflow still running")

// Starter starts and awaits payment and refund workflows for the API.
type Starter struct {
	Client    client.Client
	TaskQueue string // default TaskQueue
}

func (s Starter) queue() string {
	if s.TaskQueue != "" {
		return s.TaskQueue
	}
	return TaskQueue
}

// StartPayment starts the operation's workflow, or finds the one already started for the key:
// REJECT_DUPLICATE and USE_EXISTING make a second start for the same key a no-op, so a retried
// start after a crash can never run a payment twice. It returns the run's id.
func (s Starter) StartPayment(ctx context.Context, key string, in PaymentInput) (string, error) {
	opts := client.StartWorkflowOptions{
		ID:                       PaymentWorkflowID(in.MerchantID, key),
		TaskQueue:                s.queue(),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		// When this process also runs a worker on the queue (kasa dev), the server hands the
		// first workflow task straight back with the start: with local steps the whole payment
		// then runs in that one task. Without a local worker the option does nothing.
		EnableEagerStart: true,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			SearchPaymentStatus.ValueSet("processing"),
			SearchMerchantID.ValueSet(in.MerchantID.String()),
		),
	}
	run, err := s.Client.ExecuteWorkflow(ctx, opts, WorkflowPayment, in)
	if err != nil {
		return "", fmt.Errorf("start payment workflow: %w", err)
	}
	return run.GetRunID(), nil
}

// AwaitPayment waits for the result of the workflow's run until ctx ends (then ErrStillRunning).
// Naming the run spares the server finding the current one on every poll.
func (s Starter) AwaitPayment(ctx context.Context, merchantID uuid.UUID, key, runID string) (PaymentResult, error) {
	var res PaymentResult
	err := s.Client.GetWorkflow(ctx, PaymentWorkflowID(merchantID, key), runID).Get(ctx, &res)
	if err != nil && ctx.Err() != nil {
		return res, ErrStillRunning
	}
	return res, err
}

// StartRefund starts the refund's workflow under the same id policies as StartPayment: a second
// start for the same key finds the first run. It returns the run's id.
func (s Starter) StartRefund(ctx context.Context, key string, in RefundInput) (string, error) {
	opts := client.StartWorkflowOptions{
		ID:                       RefundWorkflowID(in.MerchantID, key),
		TaskQueue:                s.queue(),
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		EnableEagerStart:         true,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			SearchPaymentStatus.ValueSet("processing"),
			SearchMerchantID.ValueSet(in.MerchantID.String()),
		),
	}
	run, err := s.Client.ExecuteWorkflow(ctx, opts, WorkflowRefund, in)
	if err != nil {
		return "", fmt.Errorf("start refund workflow: %w", err)
	}
	return run.GetRunID(), nil
}

// AwaitRefund waits for the result of the refund workflow's run until ctx ends (then
// ErrStillRunning).
func (s Starter) AwaitRefund(ctx context.Context, merchantID uuid.UUID, key, runID string) (RefundWorkflowResult, error) {
	var res RefundWorkflowResult
	err := s.Client.GetWorkflow(ctx, RefundWorkflowID(merchantID, key), runID).Get(ctx, &res)
	if err != nil && ctx.Err() != nil {
		return res, ErrStillRunning
	}
	return res, err
}

// Ready reports whether Temporal answers and a worker polls the payment task queue.
func (s Starter) Ready(ctx context.Context) error {
	if _, err := s.Client.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		return fmt.Errorf("temporal: %w", err)
	}
	resp, err := s.Client.DescribeTaskQueue(ctx, s.queue(), enumspb.TASK_QUEUE_TYPE_WORKFLOW)
	if err != nil {
		return fmt.Errorf("describe task queue: %w", err)
	}
	if len(resp.GetPollers()) == 0 {
		return fmt.Errorf("no worker polls task queue %q", s.queue())
	}
	return nil
}

// IsUnavailable reports whether err means Temporal could not be reached (vs. a rejected request).
func IsUnavailable(err error) bool {
	var unavailable *serviceerror.Unavailable
	var deadline *serviceerror.DeadlineExceeded
	return errors.As(err, &unavailable) || errors.As(err, &deadline) ||
		errors.Is(err, context.DeadlineExceeded)
}

// ErrSettlementRejected: the workflow refused a settlement (not unknown, already settled, malformed,
// or no such workflow).
var ErrSettlementRejected = errors.New("settlement rejected")

// Settle resolves an unknown payment or refund (workflowID is a PaymentWorkflowID or a
// RefundWorkflowID) through the checked `settle` update and returns its final status. One that is
// not unknown (or a malformed settlement) is ErrSettlementRejected.
func (s Starter) Settle(ctx context.Context, workflowID string, st Settlement) (string, error) {
	h, err := s.Client.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		WorkflowID: workflowID, UpdateName: UpdateSettle, Args: []any{st},
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err != nil {
		var notFound *serviceerror.NotFound
		if errors.As(err, &notFound) {
			return "", fmt.Errorf("%w: %v", ErrSettlementRejected, err)
		}
		return "", err
	}
	var status string
	if err := h.Get(ctx, &status); err != nil {
		var appErr *temporal.ApplicationError
		if errors.As(err, &appErr) {
			return "", fmt.Errorf("%w: %s", ErrSettlementRejected, appErr.Message())
		}
		return "", err
	}
	return status, nil
}
