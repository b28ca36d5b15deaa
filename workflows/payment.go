package workflows

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/payment"
)

// DefaultChargeBudget bounds re-sends to an idempotent provider before the outcome is unknown.
const DefaultChargeBudget = 2 * time.Minute

// DefaultChargeTimeout is one charge attempt's StartToClose when the input names none.
const DefaultChargeTimeout = 30 * time.Second

// DefaultBookingWindow is PaymentInput.BookingWindow when the input names none.
const DefaultBookingWindow = 30 * time.Second

// parkedRoundsPerRun bounds the inquiries of one run of an unknown payment: then it continues
// as a new run, so a history never grows without bound however long the bank takes.
const parkedRoundsPerRun = 100

// inquiryBackoff is how long the workflow waits before its first status inquiry, and the cap
// of the growing interval between inquiries while a payment is unknown.
const (
	inquiryDelay   = 2 * time.Second
	inquiryMaxWait = time.Hour
	maxInquirySend = 3 // charge sends allowed with capability inquiry, each preceded by an inquiry
)

// Database steps are idempotent and must eventually happen: retried without an attempt limit.
// As local activities they are retried by the worker, and run again by another worker if this
// one dies: idempotence is what makes both safe.
var stepRetry = &temporal.RetryPolicy{
	InitialInterval:        100 * time.Millisecond,
	BackoffCoefficient:     2,
	MaximumInterval:        10 * time.Second,
	NonRetryableErrorTypes: []string{ErrTypeInsufficientFunds, ErrTypeInconsistent},
}

// stepPatience is how long a database step is retried: for as long as an outage lasts. It
// must be explicit: a local activity's ScheduleToClose defaults to its StartToClose, which would
// fail the workflow (and leave the payment processing) 15 s into a database outage.
const stepPatience = 10 * 365 * 24 * time.Hour

var (
	localStepOptions = workflow.LocalActivityOptions{StartToCloseTimeout: 15 * time.Second, ScheduleToCloseTimeout: stepPatience, RetryPolicy: stepRetry}
	stepOptions      = workflow.ActivityOptions{StartToCloseTimeout: 15 * time.Second, ScheduleToCloseTimeout: stepPatience, RetryPolicy: stepRetry}
)

// localStepOptionsFor are the local steps' options of a run of Revision rev. From Revision 8 a
// local step's retries wait up to a minute, longer than a workflow task's timeout (10 s): the
// SDK then waits for each on a server timer. A shorter wait keeps the task open, completing it
// every few seconds for as long as a database outage lasts: about 1,350 history events an hour
// for each run caught in it (Temporal ends a run at 51,200), and as many tasks for Temporal.
func localStepOptionsFor(rev int) workflow.LocalActivityOptions {
	if rev < 8 {
		return localStepOptions
	}
	o, retry := localStepOptions, *stepRetry
	retry.MaximumInterval = time.Minute
	o.RetryPolicy = &retry
	return o
}

// chargeOptions returns the provider call's options for a capability. Only an idempotent provider
// may see the same charge twice; for the others every send is a single attempt.
func chargeOptions(in PaymentInput) workflow.ActivityOptions {
	o := workflow.ActivityOptions{
		StartToCloseTimeout: in.ChargeTimeout,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        200 * time.Millisecond,
			BackoffCoefficient:     2,
			MaximumInterval:        10 * time.Second,
			NonRetryableErrorTypes: []string{ErrTypeDeclined, ErrTypeRejected, ErrTypeNotFound, ErrTypeInquiryNotAllowed},
		},
	}
	if o.StartToCloseTimeout == 0 {
		o.StartToCloseTimeout = DefaultChargeTimeout
	}
	if in.Capability == CapabilityIdempotent {
		o.ScheduleToCloseTimeout = in.ChargeBudget
		if o.ScheduleToCloseTimeout == 0 {
			o.ScheduleToCloseTimeout = DefaultChargeBudget
		}
	} else {
		o.RetryPolicy.MaximumAttempts = 1
	}
	return o
}

// PaymentWorkflow: reserve -> charge (strategy by capability) -> finalize or release; an outcome
// that cannot be known is parked as unknown until a settlement signal resolves it.
func PaymentWorkflow(ctx workflow.Context, in PaymentInput) (PaymentResult, error) {
	refuseNewer(in.Revision)
	ctx = ignoreCancel(ctx, in.Revision)
	if in.Revision >= 2 && in.Capability == "" {
		c, err := workerPolicy(ctx, in.Revision)
		if err != nil {
			return PaymentResult{}, err
		}
		in = in.WithPolicy(c)
	}
	reserve := ActivityReserveFunds
	if in.Revision >= 2 {
		reserve = ActivityReserve
	}
	_, details := in.summary()
	w := &opRun{in: in, status: payment.StatusProcessing, op: operation{
		noun: "payment", id: in.OperationID, workflow: WorkflowPayment, details: details, amount: in.AmountMinor,
		reserve: reserve, send: ActivityCharge, inquire: ActivityInquire, post: ActivityFinalize,
		release: ActivityRelease, markUnknown: ActivityMarkUnknown, flagStuck: ActivityFlagStuck, readStatus: ActivityReadPaymentStatus,
		sendArg: func(send int, re Resend) any {
			c := ChargeInput{OperationID: in.OperationID, AccountID: in.AccountID, AmountMinor: in.AmountMinor, Currency: in.Currency, Resend: re}
			if in.LocalSteps {
				c.Capability = in.Capability
			}
			if in.Revision >= 1 {
				c.Send = send
			}
			return c
		},
		postArg:    func(ref string) any { return FinalizeInput{OperationID: in.OperationID, ProviderReference: ref} },
		releaseArg: func(code string) any { return ReleaseInput{OperationID: in.OperationID, FailureCode: code} },
	}}
	w.op.continued = func(wait time.Duration) any {
		next := w.in // a manual payment's carries its phase
		next.Parked, next.InquiryWait = true, wait
		return next
	}
	if in.CaptureManual {
		return w.runManual(ctx)
	}
	return w.run(ctx)
}

// refuseNewer fails the workflow task of a run whose rules are newer than this build's: a
// payment or refund a newer API started, which a worker not yet upgraded would otherwise run by
// its older rules. Temporal retries the task until a worker that knows the revision takes it;
// nothing was done meanwhile (docs/deployment.md, "Upgrades").
func refuseNewer(rev int) {
	if rev > CurrentRevision {
		panic(fmt.Sprintf("Revision %d is newer than this worker's %d: a worker of the release that started it runs it", rev, CurrentRevision))
	}
}

// ignoreCancel is ctx cut off from a cancellation request from Revision 7 on, the request logged:
// an operator's "Request Cancellation" would end a run that holds money, or waits for a capture
// or a settlement, with nothing left to finish it. A payment ends by the bank's answer, a
// merchant's command or a settlement (docs/operations.md, "Stuck payments").
func ignoreCancel(ctx workflow.Context, rev int) workflow.Context {
	if rev < 7 {
		return ctx
	}
	workflow.Go(ctx, func(ctx workflow.Context) {
		ctx.Done().Receive(ctx, nil)
		workflow.GetLogger(ctx).Warn("cancellation request ignored: the run ends by the bank's answer, a command or a settlement")
	})
	return uncanceled(ctx, rev)
}

// uncanceled is ctx cut off from a cancellation request from Revision 7 on: the run's context
// (ignoreCancel) and each update handler's, which waits for what the run does.
func uncanceled(ctx workflow.Context, rev int) workflow.Context {
	if rev < 7 {
		return ctx
	}
	d, _ := workflow.NewDisconnectedContext(ctx)
	return d
}

// workerPolicy asks the worker running this task how to send to the bank: the process that
// talks to the bank decides, never the one that started the workflow. The answer is recorded
// in history, so the run keeps it on every replay and across ContinueAsNew.
func workerPolicy(ctx workflow.Context, rev int) (ChargePolicy, error) {
	var c ChargePolicy
	err := workflow.ExecuteLocalActivity(workflow.WithLocalActivityOptions(ctx, localStepOptionsFor(rev)), ActivityChargePolicy).Get(ctx, &c)
	return c, err
}

// operation is what a run does at each step. A payment and a refund share the strategy (the
// capability's sends, the booking window, the parked wait, the stuck state) and differ in these.
type operation struct {
	noun     string    // "payment" or "refund": in logs and in a refused settlement's reason
	id       uuid.UUID // the operation's id: a settlement naming another is refused
	workflow string    // the workflow type a parked run continues as
	details  string    // the start's static details, which a continued run lacks
	amount   int64     // what it moves, in minor units: a charged settlement names this or nothing
	// Activity names: reserve the money, send to the provider, inquire, post (capture), release,
	// mark unknown, flag stuck, read the status.
	reserve, send, inquire, post, release, markUnknown, flagStuck, readStatus string

	sendArg    func(send int, re Resend) any // send numbers the workflow's sends from 1
	postArg    func(providerRef string) any
	releaseArg func(failureCode string) any
	continued  func(inquiryWait time.Duration) any // the input of a continued parked run

	// A manual payment's phases differ from a charge in these. posted and released are the
	// statuses post and release leave (zero: succeeded and failed); failed, when set, is what a
	// failed bank call leads to instead of release; remote sends to the bank as regular
	// activities, each send recorded in history before it goes out.
	posted, released payment.Status
	failed           func(ctx workflow.Context, code string) (PaymentResult, error)
	remote           bool
}

// run is the workflow itself, for either operation.
func (w *opRun) run(ctx workflow.Context) (PaymentResult, error) {
	in := w.in
	w.local = in.LocalSteps
	if in.Parked {
		w.status = payment.StatusUnknown
	}
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (string, error) { return string(w.status), nil }); err != nil {
		return PaymentResult{}, err
	}
	workflow.Go(ctx, w.receiveSettlements)
	// The update is the checked way to settle: its validator rejects early, late, repeated and
	// malformed settlements to the caller, and it answers with the final status.
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateSettle,
		func(ctx workflow.Context, s Settlement) (string, error) {
			ctx = uncanceled(ctx, w.in.Revision)
			w.pending = &s
			// Applied (consumed), it is answered once the operation left unknown: a manual
			// payment's capture settled not_charged is voided first.
			if err := workflow.Await(ctx, func() bool {
				return w.status != payment.StatusUnknown || (w.pending != &s && w.consumed != &s)
			}); err != nil {
				return "", err
			}
			// Set aside, it contradicts the bank's own answer. Applied, it is answered with the
			// status: unknown when the next phase's answer was lost too, a conflict when the bank
			// then said the opposite (Revision 3 on).
			switch {
			case w.status != payment.StatusUnknown:
			case w.in.Revision < 3:
				return "", errors.New(w.conflict)
			case w.conflict != "": // set aside, or applied and then held: for an operator either way
				return "", temporal.NewApplicationError(w.conflict, ErrTypeBankConflict)
			}
			return string(w.status), nil
		},
		// Validators do not run on replay: they follow the current rules.
		workflow.UpdateHandlerOptions{Validator: func(s Settlement) error { return w.checkSettlement(s, CurrentRevision) }},
	); err != nil {
		return PaymentResult{}, err
	}
	if in.Parked {
		return w.waitSettlement(ctx, in.InquiryWait)
	}
	err := w.step(ctx, w.op.reserve, in.OperationID)
	if hasType(err, ErrTypeAlreadyDecided) {
		if read, ok := w.resetOfAuthorization(ctx, err); ok {
			if read.ProviderReference == "" {
				// Its authorization's answer was lost: it waits for its settlement as before.
				w.setStatus(ctx, payment.StatusUnknown)
				return w.waitSettlement(ctx, inquiryDelay)
			}
			return w.takeOn(ctx, read.ProviderReference)
		}
		if !w.resetOfRecord(ctx, err) && !w.authorizedBeforeMove(ctx, err) {
			return w.decided(ctx, err)
		}
		err = nil // its steps run again, as after a worker's death: each finds its work done
	}
	if hasType(err, ErrTypeInsufficientFunds) {
		return w.fail(ctx, payment.FailureInsufficientFunds)
	}
	if err != nil {
		return PaymentResult{}, err
	}

	w.detail(ctx, "sent to the bank (capability %s), waiting for its answer", w.in.Capability)
	res, err := w.charge(ctx)
	return w.outcome(ctx, res, err)
}

// outcome finishes the operation with the bank's answer to its send: posted, failed, or parked
// unknown.
func (w *opRun) outcome(ctx workflow.Context, res ChargeResult, err error) (PaymentResult, error) {
	switch {
	case err == nil && res.Succeeded:
		return w.finalize(ctx, res.ProviderReference)
	case err == nil || hasType(err, ErrTypeDeclined) || hasType(err, ErrTypeRejected):
		return w.fail(ctx, payment.FailureDeclined)
	default:
		workflow.GetLogger(ctx).Warn(w.op.noun+" outcome unknown; parking for reconciliation", "error", err)
		return w.parkUnknown(ctx, err)
	}
}

type opRun struct {
	// in carries the rules: a payment's input, or the policy fields of a refund's.
	in      PaymentInput
	op      operation
	local   bool // steps are local activities (PaymentInput.LocalSteps)
	status  payment.Status
	pending *Settlement // accepted settlement, applied by parkUnknown
	// consumed is the settlement a manual payment's phase applied before the next phase began.
	consumed *Settlement
	// conflict, when set, is why a settlement was set aside: the bank's inquiry said the opposite.
	// Until an operator's retry, settlements of the refused outcome are refused.
	conflict string
	refused  string      // the outcome the conflict refuses: not_charged (charged from Revision 6 too)
	setAside *Settlement // the settlement the conflict refused, if one was pending
	// captured: the bank captured the authorization this void phase is letting go (holdCaptured),
	// so a charged settlement naming the amount captured is taken.
	captured bool
	// closing: the bank's answer to an inquiry decided the operation, whose post or release now
	// runs; a settlement would not be applied (Revision 6 refuses it).
	closing bool

	// A manual payment's: the merchant's capture or cancel, once accepted, and whether this run
	// recorded the authorization.
	command    *Command
	cancel     bool
	authorized bool
	expired    bool // capture_before passed with no command
	// voidAt is capture_before on this run's clock: when the authorization nobody captured or
	// canceled is voided, and a capture refused.
	voidAt time.Time
}

// step runs one database step. From Revision 1, a step the data contradicts does not fail the
// workflow (which would leave the payment processing, its hold kept, and nobody told): the
// payment is flagged stuck and the step runs again when an operator signals retry.
func (w *opRun) step(ctx workflow.Context, name string, arg any) error {
	return w.stepResult(ctx, name, arg, nil)
}

// stepResult is step, its answer decoded into res (when not nil).
func (w *opRun) stepResult(ctx workflow.Context, name string, arg, res any) error {
	for {
		err := w.exec(ctx, name, arg).Get(ctx, res)
		if err == nil || w.in.Revision < 1 || !hasType(err, ErrTypeInconsistent) || w.decidedElsewhere(err) {
			return err
		}
		if _, ok := w.authorizedElsewhere(err); ok {
			return err
		}
		if err := w.waitOperator(ctx, name, err); err != nil {
			return err
		}
	}
}

// waitOperator flags the payment stuck (database and search attribute), waits for the retry
// signal, and clears the flag.
func (w *opRun) waitOperator(ctx workflow.Context, name string, cause error) error {
	workflow.GetLogger(ctx).Error(w.op.noun+" stuck: waiting for an operator's retry signal", "step", name, "error", cause)
	reason := fmt.Sprintf("%s: %v", name, cause)
	w.detail(ctx, "stuck at step %s; fix the cause, then signal `retry`", reason)
	retry, err := w.flag(ctx, reason)
	if err != nil {
		return err
	}
	retry.Receive(ctx, nil)
	w.upsertStatus(ctx, string(w.status))
	return w.exec(ctx, w.op.flagStuck, FlagInput{OperationID: w.in.OperationID}).Get(ctx, nil)
}

// flag flags the operation stuck for reason (database and search attribute) and returns the
// operator's retry signals, emptied of those sent before: they are not for this. From Revision 3
// they are emptied before the flag is written, so that a retry sent once the operator saw it
// counts even when it reaches the run with the flag's own completion.
func (w *opRun) flag(ctx workflow.Context, reason string) (workflow.ReceiveChannel, error) {
	retry := workflow.GetSignalChannel(ctx, SignalRetry)
	drain := func() {
		for retry.ReceiveAsync(nil) {
		}
	}
	if w.in.Revision >= 3 {
		drain()
	}
	if err := w.exec(ctx, w.op.flagStuck, FlagInput{OperationID: w.in.OperationID, Reason: reason}).Get(ctx, nil); err != nil {
		return nil, err
	}
	w.upsertStatus(ctx, StatusStuck)
	if w.in.Revision < 3 {
		drain()
	}
	return retry, nil
}

// exec runs one database step.
func (w *opRun) exec(ctx workflow.Context, name string, arg any) workflow.Future {
	if w.local {
		return workflow.ExecuteLocalActivity(workflow.WithLocalActivityOptions(ctx, localStepOptionsFor(w.in.Revision)), name, arg)
	}
	return workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, stepOptions), name, arg)
}

// execProvider runs one provider call with the options of in's capability.
func (w *opRun) execProvider(ctx workflow.Context, in PaymentInput, name string, arg any) workflow.Future {
	o := chargeOptions(in)
	if w.local && !w.op.remote {
		return workflow.ExecuteLocalActivity(workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			StartToCloseTimeout: o.StartToCloseTimeout, ScheduleToCloseTimeout: o.ScheduleToCloseTimeout, RetryPolicy: o.RetryPolicy,
		}), name, arg)
	}
	return workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, o), name, arg)
}

// charge asks the provider with the strategy its capability allows.
func (w *opRun) charge(ctx workflow.Context) (ChargeResult, error) {
	var res ChargeResult
	err := w.send(ctx, 1, Resend{}, &res)
	if w.in.Capability != CapabilityInquiry || err == nil || !isAmbiguous(err) {
		return res, err
	}
	// Inquiry: never re-send while a charge may exist; re-send only when the provider says it
	// has none.
	for sends := 1; ; sends++ {
		ended := workflow.Now(ctx)
		res, ierr := w.awaitBooking(ctx, ended)
		if ierr == nil || !hasType(ierr, ErrTypeNotFound) {
			return res, ierr
		}
		if sends >= maxInquirySend {
			return res, err
		}
		re := Resend{PreviousEnded: ended, Waited: w.bookingWindow(), Since: workflow.Now(ctx).Sub(ended)}
		err = w.send(ctx, sends+1, re, &res)
		if err == nil || !isAmbiguous(err) {
			return res, err
		}
	}
}

// send makes send number n. From Revision 9 a send that failed before it went out (NotSent: the
// database could not be read or the send not recorded) is made again after a pause, growing to a
// minute, for as long as that lasts: nothing reached the bank, so nothing is in doubt, where
// before it was parked unknown as any failed send. Its record guards the next try: one that did
// commit makes the try a repeat, which the capability's rules answer.
func (w *opRun) send(ctx workflow.Context, n int, re Resend, res *ChargeResult) error {
	for wait := time.Second; ; wait = min(2*wait, time.Minute) {
		err := w.execProvider(ctx, w.in, w.op.send, w.op.sendArg(n, re)).Get(ctx, res)
		if w.in.Revision < 9 || !hasType(err, ErrTypeNotSent) {
			return err
		}
		workflow.GetLogger(ctx).Warn(w.op.noun+" not sent: the database failed before it went out; sending again", "error", err, "in", wait)
		if serr := workflow.Sleep(ctx, wait); serr != nil {
			return err
		}
	}
}

// awaitBooking inquires after a send that ended without an answer at sentAt, until the charge is
// found or the booking window has passed: a bank may book a charge after the connection died.
// (Revision 0 asked once.)
func (w *opRun) awaitBooking(ctx workflow.Context, sentAt time.Time) (ChargeResult, error) {
	deadline := sentAt.Add(w.bookingWindow())
	w.detail(ctx, "the bank's answer was lost; asking the bank until its booking window ends at %s, before any new send", stamp(deadline))
	wait := inquiryDelay
	for {
		_ = workflow.Sleep(ctx, wait)
		res, err := w.inquire(ctx, w.in.ChargeBudget)
		if !hasType(err, ErrTypeNotFound) || w.in.Revision < 1 || !workflow.Now(ctx).Before(deadline) {
			return res, err
		}
		wait = min(wait*2, deadline.Sub(workflow.Now(ctx)))
	}
}

// bookingWindow is the window the run recorded.
func (w *opRun) bookingWindow() time.Duration {
	if w.in.BookingWindow == 0 {
		return DefaultBookingWindow
	}
	return w.in.BookingWindow
}

func (w *opRun) inquire(ctx workflow.Context, budget time.Duration) (ChargeResult, error) {
	// An inquiry changes nothing at the provider: retried like an idempotent charge, for budget.
	o := PaymentInput{Capability: CapabilityIdempotent, ChargeBudget: budget, ChargeTimeout: w.in.ChargeTimeout}
	var res ChargeResult
	err := w.execProvider(ctx, o, w.op.inquire, w.in.OperationID).Get(ctx, &res)
	return res, err
}

// parkedInquiryBudget is how long an inquiry of the parked wait is retried. A settlement that
// arrives waits for one (the one under way, or one asked at once, Revision 11), and an import
// waits a minute for it (reconcile.DefaultSettleTimeout). From Revision 12 the inquiry gives up
// after one attempt's timeout (the charge timeout, 30 s), not the charge budget (2 min), so that
// at a bank that does not answer the import sees its settlement applied. The first attempt keeps
// its whole timeout: a bank that answers within the provider client's, which is shorter, is heard.
func (w *opRun) parkedInquiryBudget() time.Duration {
	if w.in.Revision < 12 {
		return w.in.ChargeBudget
	}
	return min(cmp.Or(w.in.ChargeBudget, DefaultChargeBudget), cmp.Or(w.in.ChargeTimeout, DefaultChargeTimeout))
}

// parkUnknown keeps the reservation and waits for a settlement (signal or update) and, with
// inquiry, keeps asking the provider on a growing timer. It never treats the payment as failed
// by itself.
func (w *opRun) parkUnknown(ctx workflow.Context, cause error) (PaymentResult, error) {
	mark := w.op.markUnknown
	if w.markingAuthorization() {
		mark = ActivityMarkAuthorizationUnknown
	}
	if err := w.step(ctx, mark, w.in.OperationID); err != nil {
		if w.decidedElsewhere(err) {
			return w.decided(ctx, err)
		}
		if ref, ok := w.authorizedElsewhere(err); ok {
			return w.takeOn(ctx, ref)
		}
		return PaymentResult{}, err
	}
	w.setStatus(ctx, payment.StatusUnknown)
	w.closing = false // a manual payment's next phase (the void of a declined capture) is open again
	if w.in.Revision >= 3 {
		// A settlement the phase before applied is answered now (unknown): waiting for this
		// phase's own settlement would hold its update, and the run's continue-as-new, as long.
		w.consumed = nil
		if hasType(cause, ErrTypeCapturedAtBank) {
			if err := w.holdCaptured(ctx, cause); err != nil {
				return PaymentResult{}, err
			}
		}
	}
	return w.waitSettlement(ctx, inquiryDelay)
}

// waitSettlement is the unknown payment's wait; wait is the time to the next inquiry.
func (w *opRun) waitSettlement(ctx workflow.Context, wait time.Duration) (PaymentResult, error) {
	if wait == 0 {
		wait = inquiryDelay
	}
	w.waitingDetail(ctx)
	recheck := false // an operator's retry of a conflict: ask the bank again at once
	since := workflow.Now(ctx)
	voided := false       // this void phase's last inquiry found the void done
	var asked *Settlement // the settlement this phase's last inquiry ran with
	for rounds := 0; ; rounds++ {
		if w.in.Revision >= 1 && rounds >= parkedRoundsPerRun && !recheck {
			if err := w.continueParked(ctx, wait); err != nil {
				return PaymentResult{}, err
			}
		}
		if recheck {
			recheck = false
		} else if w.in.Capability == CapabilityInquiry {
			if _, err := workflow.AwaitWithTimeout(ctx, wait, func() bool { return w.pending != nil }); err != nil {
				return PaymentResult{}, err
			}
		} else if w.in.Revision >= 10 {
			got, err := workflow.AwaitWithTimeout(ctx, wait, func() bool { return w.pending != nil })
			if err != nil {
				return PaymentResult{}, err
			}
			if !got {
				if res, done, err := w.finalElsewhere(ctx); done {
					return res, err
				}
				wait = min(wait*2, inquiryMaxWait)
				continue
			}
		} else if err := workflow.Await(ctx, func() bool { return w.pending != nil }); err != nil {
			return PaymentResult{}, err
		}
		if s := w.pending; s != nil && !w.askFirst(s, asked) {
			if w.revoid(s, voided) {
				// Nothing was captured, but the authorization may still be open at the bank, the
				// payer's money blocked there until it expires: the void is sent once more (voiding
				// a voided one succeeds). Only the bank's answer that it captured stops the release.
				err := w.execProvider(ctx, w.in, w.op.send, w.op.sendArg(1, Resend{})).Get(ctx, nil)
				if hasType(err, ErrTypeCapturedAtBank) {
					if err := w.holdCaptured(ctx, err); err != nil {
						return PaymentResult{}, err
					}
					recheck = w.pending == nil
					continue
				}
				return w.fail(ctx, payment.FailureDeclined)
			}
			if s.Outcome == OutcomeCharged && w.in.Step.Phase == PhaseVoid { // the bank captured it after all
				st := w.in.Step
				if st.FailureCode != payment.FailureDeclined && w.in.Revision < 6 {
					// A cancel's void: no capture command moved the money. From Revision 6 the
					// cancel is marked taken all the same, so that its key stays its own.
					st.CommandID = uuid.Nil
				}
				w.enter(Step{Phase: PhaseCapture, AuthorizationRef: st.AuthorizationRef, AmountMinor: s.AmountMinor, CommandID: st.CommandID})
			}
			if s.Outcome == OutcomeCharged {
				return w.finalize(ctx, s.ProviderReference)
			}
			return w.fail(ctx, payment.FailureDeclined)
		}
		res, err := w.inquire(ctx, w.parkedInquiryBudget())
		asked = w.pending
		voided = w.in.Step.Phase == PhaseVoid && err == nil && res.Succeeded
		// An authorization the bank still does not hold once its booking window has passed was
		// never made (Revision 6): no settlement file lists authorizations, so this answer ends it.
		neverMade := w.in.Revision >= 6 && w.in.CaptureManual && w.in.Step.Phase == PhaseAuthorize && hasType(err, ErrTypeNotFound) &&
			(w.in.Parked || !workflow.Now(ctx).Before(since.Add(w.bookingWindow())))
		switch {
		case w.pending != nil && w.pending.Outcome == OutcomeNotCharged && err == nil && res.Succeeded && w.in.Revision >= 2 &&
			!(w.in.Revision >= 3 && w.in.Step.Phase == PhaseVoid): // a void done and not_charged agree: nothing moved
			// The bank's definite answer is never overruled by a file's: keep the hold, and
			// tell an operator.
			reason := fmt.Sprintf("a not_charged settlement contradicts the bank, whose inquiry found the %s done (%s): "+
				"the hold is kept; settle it as charged, or signal retry once the bank's record is corrected", w.op.noun, res.ProviderReference)
			if err := w.holdConflict(ctx, reason, OutcomeNotCharged); err != nil {
				return PaymentResult{}, err
			}
			recheck = w.in.Revision >= 4 && w.pending == nil
			continue
		case w.in.Revision >= 3 && hasType(err, ErrTypeCapturedAtBank) &&
			!(w.in.Revision >= 6 && w.pending != nil && w.pending.Outcome == OutcomeCharged): // a charged one agrees
			if err := w.holdCaptured(ctx, err); err != nil {
				return PaymentResult{}, err
			}
			recheck = w.in.Revision >= 4 && w.pending == nil
			continue
		case w.in.Revision >= 6 && w.pending != nil && w.pending.Outcome == OutcomeCharged && (w.notDone(res, err) || neverMade):
			// Nor is it overruled by a charged one: which arrived first must not decide whether
			// the payer is charged.
			reason := fmt.Sprintf("a charged settlement contradicts the bank, whose inquiry says %s: the hold is kept; "+
				"settle it as not_charged, or signal retry once the bank's record is corrected", w.said(res, err))
			if err := w.holdConflict(ctx, reason, OutcomeCharged); err != nil {
				return PaymentResult{}, err
			}
			recheck = w.pending == nil
			continue
		case w.pending != nil:
			continue // a settlement arrived while the inquiry ran: it wins
		case neverMade:
			w.closing = true
			return w.fail(ctx, payment.FailureDeclined)
		case err == nil && res.Succeeded:
			w.closing = true
			return w.finalize(ctx, res.ProviderReference)
		case err == nil || hasType(err, ErrTypeDeclined):
			w.closing = true
			return w.fail(ctx, payment.FailureDeclined)
		}
		wait = min(wait*2, inquiryMaxWait)
	}
}

// holdCaptured keeps the hold of a manual payment whose authorization the bank captured while
// kasa was voiding it (cause): only a charged settlement naming what was captured ends it.
func (w *opRun) holdCaptured(ctx workflow.Context, cause error) error {
	w.captured = true
	defer func() { w.captured = false }()
	said := cause.Error()
	if ae := (*temporal.ApplicationError)(nil); errors.As(cause, &ae) {
		said = ae.Message()
	}
	return w.holdConflict(ctx, fmt.Sprintf("the bank captured the authorization %s that kasa was voiding (%s): the hold is kept; "+
		"settle it as charged with the amount captured, or signal retry once the bank's record is corrected", w.in.Step.AuthorizationRef, said), OutcomeNotCharged)
}

// holdConflict sets aside a settlement (if any) whose outcome, refused, the bank's own answer
// contradicts (reason): the payment stays unknown, its hold kept, flagged stuck with both answers,
// until an operator signals retry (the inquiries resume) or settles it the other way.
func (w *opRun) holdConflict(ctx workflow.Context, reason, refused string) error {
	w.conflict, w.refused = reason, refused
	if w.pending != nil {
		w.setAside, w.pending = w.pending, nil
	}
	w.detail(ctx, "%s", w.conflict)
	workflow.GetLogger(ctx).Error(w.op.noun+" settlement conflict", "reason", w.conflict)
	retry, err := w.flag(ctx, ConflictReason(refused, w.conflict)) // marked: a dry run reads it (docs/reconciliation.md)
	if err != nil {
		return err
	}
	if err := workflow.Await(ctx, func() bool { return retry.Len() > 0 || w.pending != nil }); err != nil {
		return err
	}
	retry.ReceiveAsync(nil)
	w.conflict = ""
	w.waitingDetail(ctx) // the conflict's details told the operator to retry or settle: done
	w.upsertStatus(ctx, string(w.status))
	return w.exec(ctx, w.op.flagStuck, FlagInput{OperationID: w.in.OperationID}).Get(ctx, nil)
}

// waitingDetail says, in the current details, that the unknown operation waits for a settlement.
func (w *opRun) waitingDetail(ctx workflow.Context) {
	w.detail(ctx, "unknown: the bank's answer is not known, so the hold is kept until a settlement says what the bank did "+
		"(a settlement file, or the `settle` update or signal)")
}

// continueParked ends this run and waits on in a new one, unless a settlement is on its way:
// one already accepted, or a signal not yet taken from the channel.
func (w *opRun) continueParked(ctx workflow.Context, wait time.Duration) error {
	ch := workflow.GetSignalChannel(ctx, SignalSettlement)
	for w.pending == nil {
		var s Settlement
		if !ch.ReceiveAsync(&s) {
			break
		}
		w.accept(ctx, s)
	}
	if w.pending != nil || !workflow.AllHandlersFinished(ctx) {
		return nil
	}
	return workflow.NewContinueAsNewError(ctx, w.op.workflow, w.op.continued(wait))
}

// checkSettlement accepts a settlement only for an unknown payment that has none yet: an early,
// late, repeated or malformed settlement must never change a payment. rev is the Revision whose
// rules apply.
func (w *opRun) checkSettlement(s Settlement, rev int) error {
	switch {
	case s.Outcome != OutcomeCharged && s.Outcome != OutcomeNotCharged:
		return fmt.Errorf("outcome must be %q or %q, got %q", OutcomeCharged, OutcomeNotCharged, s.Outcome)
	case rev >= 5 && s.OperationID != uuid.Nil && s.OperationID != w.op.id:
		// A payment's key names a new payment once its record has expired: a settlement read for
		// the one before must not settle it.
		return fmt.Errorf("the settlement is for %s %s, this workflow runs %s", w.op.noun, s.OperationID, w.op.id)
	case w.status != payment.StatusUnknown:
		return fmt.Errorf("%s is %s, not unknown: nothing to settle", w.op.noun, w.status)
	case w.pending != nil:
		return settling(w.op.noun, w.pending.Outcome)
	case rev >= 6 && w.closing:
		return fmt.Errorf("the bank answered kasa's inquiry: the %s is being closed as it said, nothing to settle", w.op.noun)
	case rev >= 4 && w.in.Revision >= 3 && w.consumed != nil: // applied, it still runs: the next phase is at the bank
		return settling(w.op.noun, w.consumed.Outcome)
	case rev >= 4 && w.in.CaptureManual && w.in.Step.Phase == PhaseAuthorize && s.Outcome == OutcomeCharged && s.ProviderReference == "":
		return errors.New("a charged settlement of an unknown authorization must name the bank's authorization id " +
			"(provider_reference): its capture or void is sent to it")
	case rev >= 4 && !w.in.CaptureManual && s.Outcome == OutcomeCharged && s.AmountMinor != 0 && s.AmountMinor != w.op.amount:
		return temporal.NewApplicationError(fmt.Sprintf("the settlement lists %d (minor units), but kasa asked the bank to move %d: "+
			"the hold is kept for an operator", s.AmountMinor, w.op.amount), ErrTypeSettlementAmount)
	case w.conflict != "" && s.Outcome == w.refused:
		return temporal.NewApplicationError(w.conflict, ErrTypeBankConflict)
	case w.in.CaptureManual && w.in.Step.Phase == PhaseVoid && s.Outcome == OutcomeCharged && (w.captured || w.in.Revision >= 3):
		// The bank captured the authorization kasa was voiding (it said so, or its file lists the
		// capture): what it moved is posted.
		if s.AmountMinor <= 0 || s.AmountMinor > w.in.AmountMinor {
			return temporal.NewApplicationError(fmt.Sprintf("the bank captured the authorization kasa was voiding: a charged settlement "+
				"must name the amount captured, at most the %d (minor units) authorized; it names %d", w.in.AmountMinor, s.AmountMinor), ErrTypeSettlementAmount)
		}
	case w.in.CaptureManual && w.in.Step.Phase == PhaseVoid && s.Outcome == OutcomeCharged:
		return errors.New("the payment's authorization was being voided, never captured: only not_charged settles it")
	case w.in.CaptureManual && s.Outcome == OutcomeCharged && s.AmountMinor != 0 && s.AmountMinor != w.capturing():
		return temporal.NewApplicationError(fmt.Sprintf("the settlement lists %d (minor units) captured, but kasa asked the bank to capture %d: "+
			"the hold is kept for an operator", s.AmountMinor, w.capturing()), ErrTypeSettlementAmount)
	}
	return nil
}

// settling refuses a settlement while another is being applied, naming its outcome: a caller
// that sent the same one knows it is on its way.
func settling(noun, outcome string) error {
	return temporal.NewApplicationError(fmt.Sprintf("%s is already being settled as %s", noun, outcome), ErrTypeSettling, outcome)
}

// receiveSettlements turns settlement signals into the pending settlement.
func (w *opRun) receiveSettlements(ctx workflow.Context) {
	ch := workflow.GetSignalChannel(ctx, SignalSettlement)
	for {
		var s Settlement
		ch.Receive(ctx, &s) // an undecodable payload arrives as a zero Settlement
		w.accept(ctx, s)
	}
}

// notDone says an inquiry's answer is the bank's word that the phase moved no money: a charge,
// capture or refund declined, or the authorization a void lets go released.
func (w *opRun) notDone(res ChargeResult, err error) bool {
	if w.in.Step.Phase == PhaseVoid {
		return err == nil && res.Succeeded
	}
	return (err == nil && !res.Succeeded) || hasType(err, ErrTypeDeclined)
}

// said is what an inquiry that found nothing done answered, for an operator.
func (w *opRun) said(res ChargeResult, err error) string {
	var ae *temporal.ApplicationError
	switch {
	case w.in.Step.Phase == PhaseVoid:
		return fmt.Sprintf("the authorization %s was let go (%s)", w.in.Step.AuthorizationRef, res.ProviderReference)
	case hasType(err, ErrTypeNotFound):
		return "it holds no authorization for the payment, its booking window past"
	case errors.As(err, &ae):
		return fmt.Sprintf("the %s was declined (%s)", w.op.noun, ae.Message())
	}
	return fmt.Sprintf("the %s was declined", w.op.noun)
}

// revoid says a settlement s of a void phase sends the void again before its release (Revision
// 6): not_charged, with a capability that lets the void be sent twice, unless this run's inquiry
// just found the void done.
func (w *opRun) revoid(s *Settlement, voided bool) bool {
	return w.in.Revision >= 6 && w.in.Step.Phase == PhaseVoid && s.Outcome == OutcomeNotCharged &&
		w.in.Capability != CapabilityNone && !voided
}

// askFirst says whether settlement s, which arrived between two inquiries, waits for an inquiry
// before it is applied (Revision 11, inquiry): the bank's definite answer is never overruled by a
// file's, whether the file arrives during an inquiry or between two. asked is the settlement the
// last inquiry ran with.
func (w *opRun) askFirst(s, asked *Settlement) bool {
	return w.in.Revision >= 11 && w.in.Capability == CapabilityInquiry && s != asked
}

// capturing is the capture a manual payment sent and waits to hear of: none while its
// authorization is unknown.
func (w *opRun) capturing() int64 {
	if w.in.Step.Phase == PhaseCapture {
		return w.in.Step.AmountMinor
	}
	return 0
}

// accept takes a settlement signal unless checkSettlement refuses it; a refused one is logged:
// a signal cannot be refused to its sender, only not acted on.
func (w *opRun) accept(ctx workflow.Context, s Settlement) {
	if err := w.checkSettlement(s, w.in.Revision); err != nil {
		workflow.GetLogger(ctx).Warn("ignoring settlement signal", "reason", err.Error())
		return
	}
	w.pending = &s
}

// resetOfRecord says whether err, an AlreadyDecided refusal, refused a reset of the very run that
// took the operation on (an operator's `temporal workflow reset` after a terminate by mistake,
// docs/operations.md) while the operation is still open: that run goes on, it is no second run.
// Refusals recorded before they named the run decode no run and end as before. Not a manual
// payment: run again from its start, it would authorize again whatever phase it was in (an
// unknown capture reopened as waiting for one); resetOfAuthorization takes on one that waits.
func (w *opRun) resetOfRecord(ctx workflow.Context, err error) bool {
	if w.in.CaptureManual {
		return false
	}
	status, run, ok := refusal(err)
	info := workflow.GetInfo(ctx)
	return ok && run != "" && run == info.OriginalRunID && run != info.WorkflowExecution.RunID && !status.Final()
}

// authorizedBeforeMove says whether err, an AlreadyDecided refusal, found a manual payment's
// authorization recorded by the run this one replaced (Revision 9): a late worker ran the moved
// run's first task (Starter.CheckPaymentRun) before it was terminated. Nothing else waits for the
// capture, so this run takes the payment on: its steps find the authorization and its record
// done, and it waits for the command or voids at capture_before. A reset of that very run is no
// move: resetOfAuthorization's case.
func (w *opRun) authorizedBeforeMove(ctx workflow.Context, err error) bool {
	if !w.in.CaptureManual || w.in.Revision < 9 || w.in.Step.Phase != PhaseAuthorize {
		return false
	}
	status, run, ok := refusal(err)
	return ok && status == payment.StatusRequiresCapture && run != "" && run != workflow.GetInfo(ctx).OriginalRunID
}

// resetOfAuthorization reads a manual payment that waits in its authorization's phase when err,
// an AlreadyDecided refusal, refused a reset of the run that took it on (Revision 11): after a
// terminate by mistake, `temporal workflow reset` runs it again from its first task (it
// authorized in local steps), and nothing else would capture it or void it at capture_before, or
// wait for the settlement of an authorization whose answer was lost. ok: requires_capture with
// the authorization's id (taken on), or unknown with none (parked again); a payment decided
// meanwhile, or one unknown in a later phase (its capture's or void's answer lost: a reset from
// its start cannot rebuild that phase), ends as before.
func (w *opRun) resetOfAuthorization(ctx workflow.Context, err error) (StatusRead, bool) {
	if !w.in.CaptureManual || w.in.Revision < 11 || w.in.Step.Phase != PhaseAuthorize {
		return StatusRead{}, false
	}
	status, run, ok := refusal(err)
	// The refusal itself says this is not the run that took it on (that run's step is never
	// refused); the run's own id is not read: a replay of its history has another.
	if !ok || run == "" || run != workflow.GetInfo(ctx).OriginalRunID ||
		status != payment.StatusRequiresCapture && status != payment.StatusUnknown {
		return StatusRead{}, false
	}
	var read StatusRead
	if err := w.exec(ctx, w.op.readStatus, w.in.OperationID).Get(ctx, &read); err != nil {
		return StatusRead{}, false
	}
	switch payment.Status(read.Status) {
	case payment.StatusRequiresCapture:
		return read, read.ProviderReference != ""
	case payment.StatusUnknown:
		return read, read.ProviderReference == ""
	}
	return StatusRead{}, false
}

// refusal decodes an AlreadyDecided refusal's details: the operation's status and the run that
// took it on (empty in refusals recorded before they named the run).
func refusal(err error) (status payment.Status, run string, ok bool) {
	var appErr *temporal.ApplicationError
	var s string
	if !errors.As(err, &appErr) || appErr.Details(&s, &run) != nil {
		return "", "", false
	}
	return payment.Status(s), run, true
}

// decidedElsewhere says whether err, a step's refusal, found the operation final (its status in
// the details), Revision 9 on: another run decided it while this one sent (a run moved off a task
// queue nobody polled, raced by a late worker that ran the first), and moved or released its
// money. This run then ends with that status rather than wait for an operator.
func (w *opRun) decidedElsewhere(err error) bool {
	var appErr *temporal.ApplicationError
	var status string
	return w.in.Revision >= 9 && errors.As(err, &appErr) && appErr.Type() == ErrTypeInconsistent &&
		appErr.Details(&status) == nil && payment.Status(status).Final()
}

// markingAuthorization says whether this run marks a manual payment's authorization unknown
// (Revision 10): a mark that never reopens one another run recorded meanwhile (the moved run's
// race), which would leave it open at the bank with nothing to capture or void it.
func (w *opRun) markingAuthorization() bool {
	return w.in.Revision >= 10 && w.in.CaptureManual && w.in.Step.Phase == PhaseAuthorize
}

// authorizedElsewhere is the authorization's reference when err, the refusal of a run's mark of
// its authorization as unknown, found it recorded by another run.
func (w *opRun) authorizedElsewhere(err error) (string, bool) {
	var appErr *temporal.ApplicationError
	var status, ref string
	ok := w.markingAuthorization() && errors.As(err, &appErr) && appErr.Type() == ErrTypeInconsistent &&
		appErr.Details(&status, &ref) == nil && payment.Status(status) == payment.StatusRequiresCapture && ref != ""
	return ref, ok
}

// takeOn takes on a manual payment's authorization another run recorded (ref), as the bank's
// answer would be: the run waits for its capture, or voids it at capture_before.
func (w *opRun) takeOn(ctx workflow.Context, ref string) (PaymentResult, error) {
	workflow.GetLogger(ctx).Warn(w.op.noun+" authorized by another run: taken on", "authorization", ref)
	w.closing = true
	return w.finalize(ctx, ref)
}

// finalElsewhere reads the parked operation's status (Revision 10): another run may have decided
// it while this one parked it (a run moved off a task queue nobody polled, raced by a late
// worker that ran the first), and nothing would settle this run then: no settlement file's
// import looks at a final operation. A manual payment parked in its authorization that reads it
// recorded (requires_capture: by such a run, or by this run's own task that failed after its
// step) is taken on, as the bank's answer would be: nothing else waits for its capture or voids
// it at capture_before. A read that fails is left for the next one.
func (w *opRun) finalElsewhere(ctx workflow.Context) (PaymentResult, bool, error) {
	var read StatusRead
	if err := w.exec(ctx, w.op.readStatus, w.in.OperationID).Get(ctx, &read); err != nil {
		return PaymentResult{}, false, nil
	}
	switch status := payment.Status(read.Status); {
	case status.Final():
		workflow.GetLogger(ctx).Warn(w.op.noun+" decided by another run while this one waited for a settlement", "status", status)
		w.setStatus(ctx, status)
		return PaymentResult{Status: read.Status}, true, nil
	case status == payment.StatusRequiresCapture && w.in.CaptureManual && w.in.Step.Phase == PhaseAuthorize && read.ProviderReference != "":
		res, err := w.takeOn(ctx, read.ProviderReference)
		return res, true, err
	}
	return PaymentResult{}, false, nil
}

// decided ends a run whose operation another run already decided: it changes nothing and
// answers the operation's status.
func (w *opRun) decided(ctx workflow.Context, err error) (PaymentResult, error) {
	var appErr *temporal.ApplicationError
	var status string
	if !errors.As(err, &appErr) || appErr.Details(&status) != nil {
		return PaymentResult{}, err
	}
	workflow.GetLogger(ctx).Warn(w.op.noun+" already decided by another run: nothing to do", "status", status)
	w.setStatus(ctx, payment.Status(status))
	return PaymentResult{Status: status}, nil
}

func (w *opRun) finalize(ctx workflow.Context, providerRef string) (PaymentResult, error) {
	st := cmp.Or(w.op.posted, payment.StatusSucceeded)
	var recorded AuthorizedResult
	var res any // what the step answers, read only where a rule uses it
	if st == payment.StatusRequiresCapture && w.in.Revision >= 9 {
		res = &recorded
	}
	if err := w.stepResult(ctx, w.op.post, w.op.postArg(providerRef), res); err != nil {
		return PaymentResult{}, err
	}
	w.authorized = st == payment.StatusRequiresCapture
	if w.authorized {
		w.recordedAt(ctx, recorded.DatabaseNow)
	}
	w.setStatus(ctx, st)
	return PaymentResult{Status: string(st), ProviderReference: providerRef}, nil
}

func (w *opRun) fail(ctx workflow.Context, code string) (PaymentResult, error) {
	if w.op.failed != nil {
		return w.op.failed(ctx, code)
	}
	if err := w.step(ctx, w.op.release, w.op.releaseArg(code)); err != nil {
		return PaymentResult{}, err
	}
	if w.in.Revision >= 6 && w.in.Step.Phase == PhaseVoid {
		code = w.in.Step.FailureCode // what the release wrote: canceled, or the authorization expired
	}
	st := cmp.Or(w.op.released, payment.StatusFailed)
	w.setStatus(ctx, st)
	return PaymentResult{Status: string(st), FailureCode: code}, nil
}

func (w *opRun) setStatus(ctx workflow.Context, s payment.Status) {
	w.status = s
	if s.Final() {
		w.detail(ctx, "%s", s)
	}
	w.upsertStatus(ctx, string(s))
}

func (w *opRun) upsertStatus(ctx workflow.Context, s string) {
	if err := workflow.UpsertTypedSearchAttributes(ctx, SearchPaymentStatus.ValueSet(s)); err != nil {
		workflow.GetLogger(ctx).Warn("upsert PaymentStatus", "error", err)
	}
}

func hasType(err error, typ string) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == typ
}

// isAmbiguous: anything but a definite answer from the provider leaves the outcome open.
func isAmbiguous(err error) bool {
	return !hasType(err, ErrTypeDeclined) && !hasType(err, ErrTypeRejected) && !hasType(err, ErrTypeNotFound) &&
		!hasType(err, ErrTypeInquiryNotAllowed)
}
