package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/workflows"
)

// Shape is a workflow's skeleton: its steps, each L (a local activity, run inside the workflow
// task) or R (a regular activity, a task of its own through the server); whether it starts
// eagerly (its first workflow task handed to the starting process's worker); and whether it is
// started with search attributes and upserts PaymentStatus once at the end, as a payment does.
type Shape struct {
	Steps                   string
	Eager, SearchAttributes bool
}

func (s Shape) String() string {
	out := s.Steps
	if s.Eager {
		out += "+eager"
	}
	if s.SearchAttributes {
		out += "+search-attributes"
	}
	return out
}

var (
	// PaymentShape is PaymentWorkflow's happy path: the worker's charge policy, reserve, charge,
	// finalize, each a local activity, started eagerly (TestPaymentShapeMatchesARecordedPayment).
	PaymentShape = Shape{Steps: "LLLL", Eager: true, SearchAttributes: true}
	// LeanestShape is the fastest shape Temporal allows for three steps: one workflow task.
	LeanestShape = Shape{Steps: "LLL", Eager: true}
)

// ShapeFor is the shape of a payment that succeeds at its first charge with a provider of the
// given capability: PaymentShape for all three, as the capabilities differ only when an attempt
// is repeated (workflows.ChargeInput.Capability). TestShapeForEveryCapability checks it.
func ShapeFor(workflows.Capability) Shape { return PaymentShape }

// HistoryShape is the shape a recorded workflow history shows. Eager start is not recorded in a
// history, so Eager is always false.
func HistoryShape(h *historypb.History) Shape {
	var s Shape
	started, upserts := false, 0
	for _, e := range h.GetEvents() {
		switch e.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
			started = len(e.GetWorkflowExecutionStartedEventAttributes().GetSearchAttributes().GetIndexedFields()) > 0
		case enumspb.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
			upserts++
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			s.Steps += "R"
		case enumspb.EVENT_TYPE_MARKER_RECORDED:
			if e.GetMarkerRecordedEventAttributes().GetMarkerName() == "LocalActivity" { // the SDK's marker of a local activity's result
				s.Steps += "L"
			}
		}
	}
	s.SearchAttributes = started && upserts == 1
	return s
}

// Noop is the ceiling's step: nothing.
func Noop(context.Context) error { return nil }

// ShapeWorkflow runs s's steps, each the no-op activity.
func ShapeWorkflow(ctx workflow.Context, s Shape) error {
	local := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: 10 * time.Second})
	regular := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second})
	for _, k := range s.Steps {
		var f workflow.Future
		if k == 'L' {
			f = workflow.ExecuteLocalActivity(local, Noop)
		} else {
			f = workflow.ExecuteActivity(regular, "bench.noop")
		}
		if err := f.Get(ctx, nil); err != nil {
			return err
		}
	}
	if s.SearchAttributes {
		return workflow.UpsertTypedSearchAttributes(ctx, workflows.SearchPaymentStatus.ValueSet("succeeded"))
	}
	return nil
}

// WorkflowCeiling is ceiling T: workflows of the shape with no-op steps, run back to back by
// o.Concurrency clients on a task queue served by a worker in this process, measured as Run does.
func WorkflowCeiling(ctx context.Context, tc client.Client, shape Shape, o Options) (Result, error) {
	queue := "bench-shape-" + uuid.NewString()
	w := sdkworker.New(tc, queue, sdkworker.Options{})
	w.RegisterWorkflowWithOptions(ShapeWorkflow, workflow.RegisterOptions{Name: "bench.shape"})
	w.RegisterActivityWithOptions(Noop, activity.RegisterOptions{Name: "bench.noop"})
	if err := w.Start(); err != nil {
		return Result{}, fmt.Errorf("ceiling worker: %w", err)
	}
	defer w.Stop()

	o.Path = "temporal:" + shape.String()
	r := newRunner(o, nil)
	r.op = func(ctx context.Context) outcome {
		o := client.StartWorkflowOptions{ID: "bench-shape-" + uuid.NewString(), TaskQueue: queue, EnableEagerStart: shape.Eager}
		if shape.SearchAttributes {
			// As a payment's start sets them, summary included (workflows.Starter).
			o.TypedSearchAttributes = temporal.NewSearchAttributes(
				workflows.SearchPaymentStatus.ValueSet("processing"), workflows.SearchMerchantID.ValueSet("bench"),
				workflows.SearchPaymentSummary.ValueSet("payment 12.34 TRY · invoice bench · merchant 01900000-0000-7000-8000-000000000000"))
			o.StaticSummary = "payment 12.34 TRY · invoice bench · merchant 01900000-0000-7000-8000-000000000000"
			o.StaticDetails = "**Payment** `01900000-0000-7000-8000-000000000001`\n\n- amount: 12.34 TRY\n- merchant: `01900000-0000-7000-8000-000000000000`\n" +
				"- payer account: `01900000-0000-7000-8000-000000000002`\n- invoice: bench"
		}
		run, err := tc.ExecuteWorkflow(ctx, o, "bench.shape", shape)
		if err == nil {
			err = run.Get(ctx, nil)
		}
		return outcome{ans: answer{label: "completed"}, done: time.Now(), err: err}
	}
	return r.measure(ctx)
}
