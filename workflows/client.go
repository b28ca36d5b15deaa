package workflows

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	updatepb "go.temporal.io/api/update/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/kasa-pay/kasa/payment"
)

// earlierRunPatience is how long a start waits for the open run of the key's earlier operation.
const earlierRunPatience = 10 * time.Second

// ErrStillRunning: the workflow did not finish within the caller's wait.
var ErrStillRunning = errors.New("workflow still running")

// Starter starts and awaits payment and refund workflows for the API.
type Starter struct {
	Client    client.Client
	TaskQueue string // default TaskQueue
	Namespace string // the client's namespace (default "default"), where a command's update is polled
}

func (s Starter) queue() string {
	if s.TaskQueue != "" {
		return s.TaskQueue
	}
	return TaskQueue
}

func (s Starter) namespace() string {
	if s.Namespace != "" {
		return s.Namespace
	}
	return "default"
}

// StartPayment starts the operation's workflow, or finds the one already started for the key:
// REJECT_DUPLICATE refuses a second run, and start hands back the first one when it is the same
// operation's, so a retried start after a crash can never run a payment twice. A closed run of
// another operation (the key's record expired, and the key now names a new payment) does not
// block it: see start.
// It returns the run's id.
func (s Starter) StartPayment(ctx context.Context, key string, in PaymentInput) (string, error) {
	runID, _, err := s.StartPaymentRun(ctx, key, in)
	return runID, err
}

// StartPaymentRun is StartPayment, and also says whether this call started the run: false when
// the operation's run held the id already (a repeated start, which starts nothing).
func (s Starter) StartPaymentRun(ctx context.Context, key string, in PaymentInput) (runID string, created bool, err error) {
	runID, created, err = s.start(ctx, s.paymentOptions(key, in), WorkflowPayment, in, in.OperationID)
	if err != nil {
		return "", false, fmt.Errorf("start payment workflow: %w", err)
	}
	return runID, created, nil
}

// paymentOptions are the options every run of the payment starts with.
func (s Starter) paymentOptions(key string, in PaymentInput) client.StartWorkflowOptions {
	summary, details := in.summary()
	return client.StartWorkflowOptions{
		ID:                    PaymentWorkflowID(in.MerchantID, key),
		TaskQueue:             s.queue(),
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		// When this process also runs a worker on the queue (kasa dev), the server hands the
		// first workflow task straight back with the start: with local steps the whole payment
		// then runs in that one task. Without a local worker the option does nothing.
		EnableEagerStart: true,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			SearchPaymentStatus.ValueSet("processing"),
			SearchMerchantID.ValueSet(in.MerchantID.String()),
			SearchPaymentSummary.ValueSet(listed(summary)),
		),
		StaticSummary: summary, StaticDetails: details,
	}
}

// start starts the workflow, and says whether it started the run. When a run holds the id, it
// reads that run's operation id from its input: its own operation's run is returned (running or
// closed, not started here), so a late retry (the
// sweeper's, say) never runs an operation twice, as USE_EXISTING would. Another operation's run
// is the expired key's earlier payment or refund: the new operation's run is started beside it
// (ALLOW_DUPLICATE) once it has closed, waiting for it while ctx allows; a second starter that
// waited too finds the first one's run then. The database record is what decides that an
// expired key is a new request: Temporal's own retention of closed runs has no say.
func (s Starter) start(ctx context.Context, opts client.StartWorkflowOptions, workflow string, in any, op uuid.UUID) (string, bool, error) {
	// Without it the SDK answers a refused start with a handle on the existing run. FAIL instead
	// of USE_EXISTING: a running run of another operation must never be handed back as this one's.
	opts.WorkflowExecutionErrorWhenAlreadyStarted = true
	opts.WorkflowIDConflictPolicy = enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL
	for waited := false; ; waited = true {
		run, err := s.Client.ExecuteWorkflow(ctx, opts, workflow, in)
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		if !errors.As(err, &started) {
			if err != nil {
				return "", false, err
			}
			return run.GetRunID(), true, nil
		}
		runOp, runID, herr := s.runOperation(ctx, opts.ID)
		if herr != nil {
			return "", false, fmt.Errorf("%w (and its run cannot be read: %v)", err, herr)
		}
		if runOp == op {
			return runID, false, nil
		}
		if waited {
			return "", false, err
		}
		// Open: wait a while for the earlier operation's run to close (its result does not
		// matter here); a caller that cannot wait longer is told, and the sweeper starts the
		// run later. Its own run id: the latest run may be this operation's by now.
		wctx, cancel := context.WithTimeout(ctx, earlierRunPatience)
		werr := s.Client.GetWorkflow(wctx, opts.ID, runID).Get(wctx, nil)
		if wctx.Err() != nil {
			cancel()
			return "", false, fmt.Errorf("%w (%v): %w", ErrEarlierRunOpen, werr, wctx.Err())
		}
		cancel()
		opts.WorkflowIDReusePolicy = enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE
	}
}

// ErrEarlierRunOpen: the key's earlier operation (its record expired) still runs, and a start of
// the new one must wait until it has closed.
var ErrEarlierRunOpen = errors.New("the run of an earlier operation of this key is still open")

// runOperation reads the operation id of the latest run of workflowID from its input.
func (s Starter) runOperation(ctx context.Context, workflowID string) (uuid.UUID, string, error) {
	it := s.Client.GetWorkflowHistory(ctx, workflowID, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	if !it.HasNext() {
		return uuid.Nil, "", errors.New("no history")
	}
	ev, err := it.Next()
	if err != nil {
		return uuid.Nil, "", err
	}
	attrs := ev.GetWorkflowExecutionStartedEventAttributes()
	if attrs == nil {
		return uuid.Nil, "", errors.New("the first event is not the start")
	}
	var first struct{ OperationID uuid.UUID }
	if err := converter.GetDefaultDataConverter().FromPayloads(attrs.GetInput(), &first); err != nil {
		return uuid.Nil, "", err
	}
	return first.OperationID, attrs.GetOriginalExecutionRunId(), nil
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
	runID, _, err := s.StartRefundRun(ctx, key, in)
	return runID, err
}

// StartRefundRun is StartRefund, and also says whether this call started the run.
func (s Starter) StartRefundRun(ctx context.Context, key string, in RefundInput) (runID string, created bool, err error) {
	runID, created, err = s.start(ctx, s.refundOptions(key, in), WorkflowRefund, in, in.OperationID)
	if err != nil {
		return "", false, fmt.Errorf("start refund workflow: %w", err)
	}
	return runID, created, nil
}

// refundOptions are the options every run of the refund starts with.
func (s Starter) refundOptions(key string, in RefundInput) client.StartWorkflowOptions {
	summary, details := in.summary()
	return client.StartWorkflowOptions{
		ID:                    RefundWorkflowID(in.MerchantID, key),
		TaskQueue:             s.queue(),
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		EnableEagerStart:      true,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			SearchPaymentStatus.ValueSet("processing"),
			SearchMerchantID.ValueSet(in.MerchantID.String()),
			SearchPaymentSummary.ValueSet(listed(summary)),
		),
		StaticSummary: summary, StaticDetails: details,
	}
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
	polled, err := s.polled(ctx, s.queue())
	if err != nil {
		return err
	}
	if !polled {
		return fmt.Errorf("%w %q", ErrNoWorker, s.queue())
	}
	return nil
}

// polled says whether a worker has polled the workflow task queue lately.
func (s Starter) polled(ctx context.Context, queue string) (bool, error) {
	resp, err := s.Client.DescribeTaskQueue(ctx, queue, enumspb.TASK_QUEUE_TYPE_WORKFLOW)
	if err != nil {
		return false, fmt.Errorf("describe task queue: %w", err)
	}
	for _, p := range resp.GetPollers() {
		if time.Since(p.GetLastAccessTime().AsTime()) < pollerFresh {
			return true, nil
		}
	}
	return false, nil
}

// ErrNoWorker: Temporal answers, and no worker has polled the task queue lately.
var ErrNoWorker = errors.New("no worker polls task queue")

// pollerFresh is how recently a worker must have polled to count: Temporal lists a poller for
// minutes after its worker is gone, and a live one polls again at least every long poll (a
// minute).
const pollerFresh = 2 * time.Minute

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

// ErrBankConflict: the settlement contradicts the bank's own answer (an inquiry, or its refusal
// of a void): the hold is kept and the payment flagged stuck for an operator (with
// ErrSettlementRejected).
var ErrBankConflict = errors.New("the settlement contradicts the bank's own answer")

// ErrSettlementAmountDiffers: a manual payment's workflow refused a settlement listing another
// amount than the capture it sent (with ErrSettlementRejected).
var ErrSettlementAmountDiffers = errors.New("the settlement's amount differs from the capture kasa sent")

// Settle resolves an unknown payment or refund (workflowID is a PaymentWorkflowID or a
// RefundWorkflowID) through the checked `settle` update and returns its final status. One that is
// not unknown (or a malformed settlement) is ErrSettlementRejected. ErrStillRunning says the
// workflow took this settlement (or one of the same outcome) and was still applying it when ctx
// ended: a manual payment's void may wait on the bank.
func (s Starter) Settle(ctx context.Context, workflowID string, st Settlement) (string, error) {
	var status string
	accepted, retried, err := s.call(ctx, client.UpdateWorkflowOptions{
		WorkflowID: workflowID, UpdateName: UpdateSettle, Args: []any{st},
		WaitForStage: client.WorkflowUpdateStageAccepted,
	}, &status)
	if err == nil {
		return status, nil
	}
	var notFound *serviceerror.NotFound
	var appErr *temporal.ApplicationError
	var outcome string
	switch {
	case errors.As(err, &notFound) && retried:
		// The failed workflow task may have applied it (its steps are local activities, whose
		// writes stay), and the run then ended finding its payment final: that is this answer.
		if status, ok := s.endedAs(ctx, workflowID, st); ok {
			return status, nil
		}
		return "", fmt.Errorf("%w: %v", ErrSettlementRejected, err)
	case errors.As(err, &notFound):
		return "", fmt.Errorf("%w: %v", ErrSettlementRejected, err)
	case !errors.As(err, &appErr):
		// Accepted, it is in the workflow's history and goes on, whether ctx ended the wait or
		// Temporal cut it a moment before.
		if accepted && (ctx.Err() != nil || waitCut(err)) {
			return "", ErrStillRunning
		}
		return "", err
	case appErr.Type() == ErrTypeBankConflict:
		return "", fmt.Errorf("%w: %w: %s", ErrSettlementRejected, ErrBankConflict, appErr.Message())
	case appErr.Type() == ErrTypeSettlementAmount:
		return "", fmt.Errorf("%w: %w: %s", ErrSettlementRejected, ErrSettlementAmountDiffers, appErr.Message())
	case appErr.Type() == ErrTypeSettling && appErr.Details(&outcome) == nil && outcome == st.Outcome:
		return "", fmt.Errorf("%w: %s", ErrStillRunning, appErr.Message())
	}
	return "", fmt.Errorf("%w: %s", ErrSettlementRejected, appErr.Message())
}

// Command sends a manual payment's capture or cancel (update UpdateCapture or UpdateCancel) to
// its workflow and waits until ctx ends for the status it led to: ErrStillRunning once the
// workflow accepted it (it is in its history and goes on, or its run was closed by hand with the
// command under way), payment.ErrUnavailable when it was not accepted in time (Temporal or the
// workers away: nothing is in flight), or when the workflow has not yet heard that the payment's
// authorization was recorded. An update left unanswered when ctx ends is polled once, for up to
// commandPollWait: Temporal may have accepted it and been slow to say so. The command's id is the
// update's: a repeated send of it is the same update. A refusal by the workflow's validator is
// payment.ErrNotCapturable, payment.ErrNotCancelable or a *payment.CaptureExceedsError (without
// its currency).
func (s Starter) Command(ctx context.Context, merchantID uuid.UUID, paymentKey, update string, c Command) (string, error) {
	var status string
	accepted, _, err := s.call(ctx, client.UpdateWorkflowOptions{
		UpdateID: c.ID.String(), WorkflowID: PaymentWorkflowID(merchantID, paymentKey), UpdateName: update, Args: []any{c},
		WaitForStage: client.WorkflowUpdateStageAccepted,
	}, &status)
	if !accepted {
		if refused := commandRefusal(err, update); refused != nil {
			return "", refused
		}
		// Not accepted: the workflow has not taken the command, which is then not in flight
		// (an admitted update is not durable). The caller must say so and let it be sent again;
		// unless Temporal, asked once more, says it took it after all.
		if ctx.Err() != nil || IsUnavailable(err) || waitCut(err) || unregistered(err) {
			if status, perr := s.pollCommand(ctx, PaymentWorkflowID(merchantID, paymentKey), c.ID.String(), update); !errors.Is(perr, errNotAccepted) {
				return status, perr
			}
			return "", fmt.Errorf("%w: the payment's workflow has not taken the %s yet: %v", payment.ErrUnavailable, update, err)
		}
		return "", err
	}
	return commandOutcome(status, err, ctx.Err() != nil || waitCut(err), update)
}

// commandOutcome is Command's answer for a command its workflow accepted, from the update's
// result: waited says the caller's wait ended before it came.
func commandOutcome(status string, err error, waited bool, update string) (string, error) {
	switch refused := commandRefusal(err, update); {
	case err == nil:
		return status, nil
	case refused != nil:
		return "", refused
	case waited, hasType(err, errTypeUpdateOutlived):
		return "", ErrStillRunning // accepted, so in the workflow's history: it goes on
	}
	return "", err
}

// waitCut says Temporal ended a wait on an update before its answer came: at the caller's
// deadline, or a moment before it, as the server ends a long poll that could not finish in time
// (the caller's ctx is not done yet then).
func waitCut(err error) bool {
	var cut *client.WorkflowUpdateServiceTimeoutOrCanceledError
	return errors.As(err, &cut)
}

// commandPollWait is how long a command's unanswered update is polled: a busy Temporal may
// have accepted it and not yet said so.
const commandPollWait = time.Second

// errNotAccepted: the poll found no accepted update (none, only admitted, or no answer).
var errNotAccepted = errors.New("update not accepted")

// pollCommand asks Temporal once, for up to commandPollWait after ctx, whether the workflow
// accepted the command's update: Command's answer when it did (ErrStillRunning while it runs),
// else errNotAccepted.
func (s Starter) pollCommand(ctx context.Context, workflowID, updateID, update string) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commandPollWait)
	defer cancel()
	resp, err := s.Client.WorkflowService().PollWorkflowExecutionUpdate(ctx, &workflowservice.PollWorkflowExecutionUpdateRequest{
		Namespace:  s.namespace(),
		UpdateRef:  &updatepb.UpdateRef{WorkflowExecution: &commonpb.WorkflowExecution{WorkflowId: workflowID}, UpdateId: updateID},
		WaitPolicy: &updatepb.WaitPolicy{LifecycleStage: enumspb.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ACCEPTED},
	})
	if err != nil || resp.GetStage() < enumspb.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ACCEPTED {
		return "", errNotAccepted
	}
	// Completed: the result its handler returned, or the validator's refusal (a rejected
	// update is completed too, never accepted).
	var status string
	switch o := resp.GetOutcome(); {
	case o.GetFailure() != nil:
		err = temporal.GetDefaultFailureConverter().FailureToError(o.GetFailure())
	case o.GetSuccess() != nil:
		err = converter.GetDefaultDataConverter().FromPayloads(o.GetSuccess(), &status)
	default:
		return "", ErrStillRunning
	}
	return commandOutcome(status, err, false, update)
}

// errTypeUpdateOutlived is the Temporal Server's failure of an accepted update whose run closed
// before it completed (an operator terminated or reset it). The command was taken, and its bank
// call may have gone out: it is in flight until a person settles the payment, never refused.
const errTypeUpdateOutlived = "AcceptedUpdateCompletedWorkflow"

// update sends an update, and sends it again while Temporal answers that the workflow task
// carrying it failed (WorkflowNotReady: an event such as a timer's firing arrived as the task
// ran, and the server failed the task to take it). The update was not taken then; until ctx ends
// it is sent again after a short pause. retried says it was.
func (s Starter) update(ctx context.Context, o client.UpdateWorkflowOptions) (h client.WorkflowUpdateHandle, retried bool, err error) {
	for {
		h, err = s.Client.UpdateWorkflow(ctx, o)
		var notReady *serviceerror.WorkflowNotReady
		if !errors.As(err, &notReady) {
			return h, retried, err
		}
		retried = true
		select {
		case <-ctx.Done():
			return nil, true, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// call sends the update o and reads its answer into v. An update the run refused as unknown came
// before its first workflow task registered the handlers (a run just started, reset or moved
// reads its worker's policy first): it took nothing, and is sent again after a short pause until
// ctx ends. accepted says the run took it (an answer or the run's refusal may follow); retried is
// update's.
func (s Starter) call(ctx context.Context, o client.UpdateWorkflowOptions, v any) (accepted, retried bool, err error) {
	for {
		h, r, err := s.update(ctx, o)
		retried = retried || r
		if err != nil {
			return false, retried, err
		}
		if err = h.Get(ctx, v); !unregistered(err) {
			return true, retried, err
		}
		select {
		case <-ctx.Done():
			return false, retried, err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// unregistered says err is the SDK's refusal of an update no handler of the run took yet. The
// SDK gives it no type of its own, only these words.
func unregistered(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && strings.HasPrefix(appErr.Message(), "unknown update ")
}

// endedAs reads the result of the workflow's latest run, closed, and says whether it ended as
// settlement st leads to: succeeded for charged, failed or canceled for not_charged.
func (s Starter) endedAs(ctx context.Context, workflowID string, st Settlement) (string, bool) {
	var res PaymentResult
	if err := s.Client.GetWorkflow(ctx, workflowID, "").Get(ctx, &res); err != nil {
		return "", false
	}
	charged := payment.Status(res.Status) == payment.StatusSucceeded
	return res.Status, payment.Status(res.Status).Final() && charged == (st.Outcome == OutcomeCharged)
}

// commandRefusal is the domain error of a command the workflow refused, or nil: its detail is
// the workflow's own words, never the SDK's or Temporal's text (it reaches the merchant).
func commandRefusal(err error, update string) error {
	var appErr *temporal.ApplicationError
	var notFound *serviceerror.NotFound
	switch {
	case err == nil:
		return nil
	case errors.As(err, &appErr) && appErr.Type() == ErrTypeCaptureExceeds:
		var capturable int64
		_ = appErr.Details(&capturable)
		return &payment.CaptureExceedsError{Capturable: capturable}
	case errors.As(err, &appErr) && appErr.Type() == ErrTypeNotCapturable:
		return fmt.Errorf("%w: %s", payment.ErrNotCapturable, appErr.Message())
	case errors.As(err, &appErr) && appErr.Type() == ErrTypeNotCancelable:
		return fmt.Errorf("%w: %s", payment.ErrNotCancelable, appErr.Message())
	case errors.As(err, &appErr) && appErr.Type() == ErrTypeAuthorizing: // not taken, and not refused either
		return fmt.Errorf("%w: %s", payment.ErrUnavailable, appErr.Message())
	case errors.As(err, &notFound) && update == UpdateCapture: // its workflow ended: the payment is final
		return payment.ErrNotCapturable
	case errors.As(err, &notFound):
		return payment.ErrNotCancelable
	}
	return nil
}
