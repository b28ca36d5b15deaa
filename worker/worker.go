// Package worker registers every workflow and activity under its explicit, history-recorded name
// and runs the Temporal worker for the payment task queue.
package worker

import (
	"context"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/activities"
	"github.com/kasa-pay/kasa/config"
	"github.com/kasa-pay/kasa/workflows"
)

// Registry is what both a real worker and the test environment register on.
type Registry interface {
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
	RegisterActivityWithOptions(a any, options activity.RegisterOptions)
}

// Register adds the payment and refund workflows and their activities under their constant names.
func Register(r Registry, a *activities.Activities) {
	r.RegisterWorkflowWithOptions(workflows.PaymentWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowPayment})
	r.RegisterWorkflowWithOptions(workflows.RefundWorkflow, workflow.RegisterOptions{Name: workflows.WorkflowRefund})
	for name, fn := range map[string]any{
		workflows.ActivityReserveFunds:             a.ReserveFunds,
		workflows.ActivityReserve:                  a.Reserve,
		workflows.ActivityCharge:                   a.Charge,
		workflows.ActivityInquire:                  a.InquireCharge,
		workflows.ActivityFinalize:                 a.Finalize,
		workflows.ActivityRelease:                  a.Release,
		workflows.ActivityMarkUnknown:              a.MarkUnknown,
		workflows.ActivityFlagStuck:                a.FlagStuck,
		workflows.ActivityReadPaymentStatus:        a.ReadPaymentStatus,
		workflows.ActivityMarkAuthorizationUnknown: a.MarkAuthorizationUnknown,
		workflows.ActivityChargePolicy:             a.ChargePolicy,

		workflows.ActivityAuthorize:            a.Authorize,
		workflows.ActivityInquireAuthorization: a.InquireAuthorization,
		workflows.ActivityAuthorized:           a.Authorized,
		workflows.ActivityCaptureAuthorization: a.CaptureAuthorization,
		workflows.ActivityInquireCapture:       a.InquireCapture,
		workflows.ActivityCaptured:             a.Captured,
		workflows.ActivityVoidAuthorization:    a.VoidAuthorization,
		workflows.ActivityInquireVoid:          a.InquireVoid,
		workflows.ActivityCanceled:             a.Canceled,

		workflows.ActivityHoldRefund:        a.HoldRefund,
		workflows.ActivityHoldRefundForRun:  a.HoldRefundForRun,
		workflows.ActivitySendRefund:        a.SendRefund,
		workflows.ActivityInquireRefund:     a.InquireRefund,
		workflows.ActivityPostRefund:        a.PostRefund,
		workflows.ActivityReleaseRefund:     a.ReleaseRefund,
		workflows.ActivityMarkRefundUnknown: a.MarkRefundUnknown,
		workflows.ActivityFlagRefundStuck:   a.FlagRefundStuck,
		workflows.ActivityReadRefundStatus:  a.ReadRefundStatus,
	} {
		r.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
}

// StopTimeout is how long a stopping worker (SIGTERM) lets its in-flight activities finish,
// a bank call among them, before it ends them: within the 30 s an orchestrator gives a
// process to stop (docs/deployment.md). config.Validate keeps the provider timeout under it.
const StopTimeout = config.WorkerStopTimeout

// New returns a worker for the task queue with everything registered; call Start/Stop.
// onFatal, when not nil, is called when the SDK stops the worker for good (its namespace is
// gone, say): it polls nothing from then on, and its process should end.
func New(c client.Client, taskQueue string, a *activities.Activities, onFatal func(error)) sdkworker.Worker {
	if taskQueue == "" {
		taskQueue = workflows.TaskQueue
	}
	ends := &stopDeadline{Context: context.Background(), done: make(chan struct{})}
	w := sdkworker.New(c, taskQueue, sdkworker.Options{WorkerStopTimeout: StopTimeout, OnFatalError: onFatal,
		BackgroundActivityContext: ends})
	Register(w, a)
	return &bounded{Worker: w, ends: ends}
}

// bounded is a worker whose Stop ends whatever still runs StopTimeout after it began. The SDK
// applies the timeout to its workflow, local-activity and activity workers one after the other,
// so a local step waiting on the database would otherwise hold the stop up to twice as long,
// past the grace an orchestrator gives before it SIGKILLs the process.
type bounded struct {
	sdkworker.Worker
	ends *stopDeadline
}

func (b *bounded) Stop() {
	t := time.AfterFunc(StopTimeout, b.ends.expire)
	defer t.Stop()
	b.Worker.Stop()
}

// stopDeadline is the activities' context: it ends as a deadline does, never as a cancellation.
// The SDK takes a canceled local activity for the workflow's own cancellation, which would end
// the run with its payment or refund still processing; a deadline is an attempt's timeout, which
// the run retries (on the next worker) as any other.
type stopDeadline struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func (d *stopDeadline) expire()               { d.once.Do(func() { close(d.done) }) }
func (d *stopDeadline) Done() <-chan struct{} { return d.done }

func (d *stopDeadline) Err() error {
	select {
	case <-d.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
