package workflows

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
)

// MovePayment starts the payment's run again on this starter's task queue when its run waits
// where nothing will run it: open, on another task queue that no worker has polled lately, and
// never handed to a worker (no workflow task ever started). A process that started it while
// the workers were leaving that queue (a poller counts as fresh for two minutes) would otherwise
// leave it processing for ever. The new run replaces the stranded one in one call (Temporal
// terminates it as it starts the new one), so a crash between the two leaves nothing half done.
// A worker that takes the stranded run's first task just before it is replaced may still run
// some of its steps: the database decides the payment once whichever run asks (its reserve,
// the numbered sends, the finalize), and the bank's idempotency key is the payment's. It says
// whether it moved the run.
func (s Starter) MovePayment(ctx context.Context, key string, in PaymentInput) (bool, error) {
	return s.move(ctx, s.paymentOptions(key, in), WorkflowPayment, in, in.OperationID)
}

// MoveRefund is MovePayment for a refund's run: the refund's hold and numbered sends decide it
// once whichever run asks, and the bank's idempotency key is the refund's.
func (s Starter) MoveRefund(ctx context.Context, key string, in RefundInput) (bool, error) {
	return s.move(ctx, s.refundOptions(key, in), WorkflowRefund, in, in.OperationID)
}

// move starts workflow again with opts (this starter's task queue) in place of the run of
// operation op, when that run waits where nothing will run it (MovePayment).
func (s Starter) move(ctx context.Context, opts client.StartWorkflowOptions, workflow string, in any, op uuid.UUID) (bool, error) {
	id := opts.ID
	desc, err := s.Client.DescribeWorkflow(ctx, id, "")
	var gone *serviceerror.NotFound
	if errors.As(err, &gone) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	d := desc.RawResponse
	info := d.GetWorkflowExecutionInfo()
	queue := info.GetTaskQueue()
	if info.GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING || queue == s.queue() ||
		info.GetHistoryLength() > 2 || d.GetPendingWorkflowTask().GetState() != enumspb.PENDING_WORKFLOW_TASK_STATE_SCHEDULED {
		return false, nil
	}
	switch polled, err := s.polled(ctx, queue); {
	case err != nil:
		return false, err
	case polled:
		return false, nil // its workers are there, or still leaving: it may yet run
	}
	// The key's earlier operation (its record expired) is not this one's to replace.
	if runOp, _, err := s.runOperation(ctx, id); err != nil || runOp != op {
		return false, err
	}
	// TERMINATE_EXISTING ends the open run. Should it close first (a late worker ran it after
	// all), ALLOW_DUPLICATE_FAILED_ONLY refuses the start (the server takes no REJECT_DUPLICATE
	// with TERMINATE_EXISTING).
	opts.WorkflowIDConflictPolicy = enumspb.WORKFLOW_ID_CONFLICT_POLICY_TERMINATE_EXISTING
	opts.WorkflowIDReusePolicy = enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY
	opts.WorkflowExecutionErrorWhenAlreadyStarted = true
	if _, err := s.Client.ExecuteWorkflow(ctx, opts, workflow, in); err != nil {
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		if errors.As(err, &started) {
			return false, nil
		}
		return false, fmt.Errorf("move %s workflow from task queue %q: %w", workflow, queue, err)
	}
	return true, nil
}
