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

// RunState is what CheckPaymentRun found of an operation's latest run.
type RunState int

const (
	RunOpen   RunState = iota // open where it may yet run
	RunClosed                 // closed, or gone past Temporal's retention
	RunMoved                  // it waited where nothing would run it: started again here
)

// CheckPaymentRun reads the payment's latest run in one describe, and starts it again on this
// starter's task queue when it waits where nothing will run it: open, on another task queue that
// no worker has polled lately, and never handed to a worker (no workflow task ever started). A
// process that started it while the workers were leaving that queue (a poller counts as fresh
// for two minutes) would otherwise leave it processing for ever. The new run replaces the
// stranded one in one call (Temporal terminates it as it starts the new one), so a crash between
// the two leaves nothing half done. A worker that takes the stranded run's first task just
// before it is replaced may still run some of its steps: the database decides the payment once
// whichever run asks (its reserve, the numbered sends, the finalize), and the bank's idempotency
// key is the payment's.
func (s Starter) CheckPaymentRun(ctx context.Context, key string, in PaymentInput) (RunState, error) {
	return s.check(ctx, s.paymentOptions(key, in), WorkflowPayment, in, in.OperationID)
}

// CheckRefundRun is CheckPaymentRun for a refund's run: the refund's hold and numbered sends
// decide it once whichever run asks, and the bank's idempotency key is the refund's.
func (s Starter) CheckRefundRun(ctx context.Context, key string, in RefundInput) (RunState, error) {
	return s.check(ctx, s.refundOptions(key, in), WorkflowRefund, in, in.OperationID)
}

// check reads the latest run of operation op's workflow and starts workflow again with opts
// (this starter's task queue) in its place when it is stranded (CheckPaymentRun).
func (s Starter) check(ctx context.Context, opts client.StartWorkflowOptions, workflow string, in any, op uuid.UUID) (RunState, error) {
	id := opts.ID
	desc, err := s.Client.DescribeWorkflow(ctx, id, "")
	var gone *serviceerror.NotFound
	if errors.As(err, &gone) {
		return RunClosed, nil
	}
	if err != nil {
		return RunOpen, err
	}
	d := desc.RawResponse
	info := d.GetWorkflowExecutionInfo()
	queue := info.GetTaskQueue()
	if info.GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		return RunClosed, nil
	}
	if queue == s.queue() || info.GetHistoryLength() > 2 ||
		d.GetPendingWorkflowTask().GetState() != enumspb.PENDING_WORKFLOW_TASK_STATE_SCHEDULED {
		return RunOpen, nil
	}
	switch polled, err := s.polled(ctx, queue); {
	case err != nil:
		return RunOpen, err
	case polled:
		return RunOpen, nil // its workers are there, or still leaving: it may yet run
	}
	// The key's earlier operation (its record expired) is not this one's to replace.
	if runOp, _, err := s.runOperation(ctx, id); err != nil || runOp != op {
		return RunOpen, err
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
			return RunOpen, nil // a late worker ran it after all; the next check reads it closed
		}
		return RunOpen, fmt.Errorf("move %s workflow from task queue %q: %w", workflow, queue, err)
	}
	return RunMoved, nil
}
