package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/payment"
)

// DefaultChargeBudget bounds re-sends to an idempotent provider before the outcome is unknown.
const DefaultChargeBudget = 2 * time.Minute

// DefaultChargeTimeout is one charge attempt's StartToClose when the input names none.
const DefaultChargeTimeout = 30 * time.Second

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

var (
	localStepOptions = workflow.LocalActivityOptions{StartToCloseTimeout: 15 * time.Second, RetryPolicy: stepRetry}
	stepOptions      = workflow.ActivityOptions{StartToCloseTimeout: 15 * time.Second, RetryPolicy: stepRetry}
)

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
	w := &paymentRun{in: in, status: payment.StatusProcessing}
	w.local = in.LocalSteps
	if err := workflow.SetQueryHandler(ctx, QueryStatus, func() (string, error) { return string(w.status), nil }); err != nil {
		return PaymentResult{}, err
	}
	workflow.Go(ctx, w.receiveSettlements)
	// The update is the checked way to settle: its validator rejects early, late, repeated and
	// malformed settlements to the caller, and it answers with the final status.
	if err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateSettle,
		func(ctx workflow.Context, s Settlement) (string, error) {
			w.pending = &s
			if err := workflow.Await(ctx, func() bool { return w.status.Final() }); err != nil {
				return "", err
			}
			return string(w.status), nil
		},
		workflow.UpdateHandlerOptions{Validator: func(s Settlement) error { return w.checkSettlement(s) }},
	); err != nil {
		return PaymentResult{}, err
	}
	err := w.exec(ctx, ActivityReserveFunds, in.OperationID).Get(ctx, nil)
	if hasType(err, ErrTypeInsufficientFunds) {
		return w.fail(ctx, payment.FailureInsufficientFunds)
	}
	if err != nil {
		return PaymentResult{}, err
	}

	res, err := w.charge(ctx)
	switch {
	case err == nil && res.Succeeded:
		return w.finalize(ctx, res.ProviderReference)
	case err == nil || hasType(err, ErrTypeDeclined) || hasType(err, ErrTypeRejected):
		return w.fail(ctx, payment.FailureDeclined)
	default:
		workflow.GetLogger(ctx).Warn("charge outcome unknown; parking for reconciliation", "error", err)
		return w.parkUnknown(ctx)
	}
}

type paymentRun struct {
	in      PaymentInput
	local   bool // steps are local activities (PaymentInput.LocalSteps)
	status  payment.Status
	pending *Settlement // accepted settlement, applied by parkUnknown
}

// exec runs one database step.
func (w *paymentRun) exec(ctx workflow.Context, name string, arg any) workflow.Future {
	if w.local {
		return workflow.ExecuteLocalActivity(workflow.WithLocalActivityOptions(ctx, localStepOptions), name, arg)
	}
	return workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, stepOptions), name, arg)
}

// execProvider runs one provider call with the options of in's capability.
func (w *paymentRun) execProvider(ctx workflow.Context, in PaymentInput, name string, arg any) workflow.Future {
	o := chargeOptions(in)
	if w.local {
		return workflow.ExecuteLocalActivity(workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
			StartToCloseTimeout: o.StartToCloseTimeout, ScheduleToCloseTimeout: o.ScheduleToCloseTimeout, RetryPolicy: o.RetryPolicy,
		}), name, arg)
	}
	return workflow.ExecuteActivity(workflow.WithActivityOptions(ctx, o), name, arg)
}

// charge asks the provider with the strategy its capability allows.
func (w *paymentRun) charge(ctx workflow.Context) (ChargeResult, error) {
	in := ChargeInput{OperationID: w.in.OperationID, AccountID: w.in.AccountID, AmountMinor: w.in.AmountMinor, Currency: w.in.Currency}
	if w.local {
		in.Capability = w.in.Capability
	}
	var res ChargeResult
	err := w.execProvider(ctx, w.in, ActivityCharge, in).Get(ctx, &res)
	if w.in.Capability != CapabilityInquiry || err == nil || !isAmbiguous(err) {
		return res, err
	}
	// Inquiry: never re-send while a charge may exist; re-send only when the provider says it
	// has none.
	for sends := 1; ; sends++ {
		_ = workflow.Sleep(ctx, inquiryDelay)
		res, ierr := w.inquire(ctx)
		if ierr == nil || !hasType(ierr, ErrTypeNotFound) {
			return res, ierr
		}
		if sends >= maxInquirySend {
			return res, err
		}
		err = w.execProvider(ctx, w.in, ActivityCharge, in).Get(ctx, &res)
		if err == nil || !isAmbiguous(err) {
			return res, err
		}
	}
}

func (w *paymentRun) inquire(ctx workflow.Context) (ChargeResult, error) {
	// An inquiry changes nothing at the provider: retried like an idempotent charge.
	o := PaymentInput{Capability: CapabilityIdempotent, ChargeBudget: w.in.ChargeBudget, ChargeTimeout: w.in.ChargeTimeout}
	var res ChargeResult
	err := w.execProvider(ctx, o, ActivityInquire, w.in.OperationID).Get(ctx, &res)
	return res, err
}

// parkUnknown keeps the reservation and waits for a settlement (signal or update) and, with
// inquiry, keeps asking the provider on a growing timer. It never treats the payment as failed
// by itself.
func (w *paymentRun) parkUnknown(ctx workflow.Context) (PaymentResult, error) {
	if err := w.exec(ctx, ActivityMarkUnknown, w.in.OperationID).Get(ctx, nil); err != nil {
		return PaymentResult{}, err
	}
	w.setStatus(ctx, payment.StatusUnknown)
	wait := inquiryDelay
	for {
		if w.in.Capability == CapabilityInquiry {
			if _, err := workflow.AwaitWithTimeout(ctx, wait, func() bool { return w.pending != nil }); err != nil {
				return PaymentResult{}, err
			}
		} else if err := workflow.Await(ctx, func() bool { return w.pending != nil }); err != nil {
			return PaymentResult{}, err
		}
		if s := w.pending; s != nil {
			if s.Outcome == OutcomeCharged {
				return w.finalize(ctx, s.ProviderReference)
			}
			return w.fail(ctx, payment.FailureDeclined)
		}
		res, err := w.inquire(ctx)
		switch {
		case w.pending != nil:
			continue // a settlement arrived while the inquiry ran: it wins
		case err == nil && res.Succeeded:
			return w.finalize(ctx, res.ProviderReference)
		case err == nil || hasType(err, ErrTypeDeclined):
			return w.fail(ctx, payment.FailureDeclined)
		}
		wait = min(wait*2, inquiryMaxWait)
	}
}

// checkSettlement accepts a settlement only for an unknown payment that has none yet: an early,
// late, repeated or malformed settlement must never change a payment.
func (w *paymentRun) checkSettlement(s Settlement) error {
	switch {
	case s.Outcome != OutcomeCharged && s.Outcome != OutcomeNotCharged:
		return fmt.Errorf("outcome must be %q or %q, got %q", OutcomeCharged, OutcomeNotCharged, s.Outcome)
	case w.status != payment.StatusUnknown:
		return fmt.Errorf("payment is %s, not unknown: nothing to settle", w.status)
	case w.pending != nil:
		return fmt.Errorf("payment is already being settled as %s", w.pending.Outcome)
	}
	return nil
}

// receiveSettlements turns settlement signals into the pending settlement, ignoring (and logging)
// the ones checkSettlement refuses: a signal cannot be refused to its sender, only not acted on.
func (w *paymentRun) receiveSettlements(ctx workflow.Context) {
	ch := workflow.GetSignalChannel(ctx, SignalSettlement)
	for {
		var s Settlement
		ch.Receive(ctx, &s) // an undecodable payload arrives as a zero Settlement
		if err := w.checkSettlement(s); err != nil {
			workflow.GetLogger(ctx).Warn("ignoring settlement signal", "reason", err.Error())
			continue
		}
		w.pending = &s
	}
}

func (w *paymentRun) finalize(ctx workflow.Context, providerRef string) (PaymentResult, error) {
	in := FinalizeInput{OperationID: w.in.OperationID, ProviderReference: providerRef}
	if err := w.exec(ctx, ActivityFinalize, in).Get(ctx, nil); err != nil {
		return PaymentResult{}, err
	}
	w.setStatus(ctx, payment.StatusSucceeded)
	return PaymentResult{Status: string(payment.StatusSucceeded), ProviderReference: providerRef}, nil
}

func (w *paymentRun) fail(ctx workflow.Context, code string) (PaymentResult, error) {
	in := ReleaseInput{OperationID: w.in.OperationID, FailureCode: code}
	if err := w.exec(ctx, ActivityRelease, in).Get(ctx, nil); err != nil {
		return PaymentResult{}, err
	}
	w.setStatus(ctx, payment.StatusFailed)
	return PaymentResult{Status: string(payment.StatusFailed), FailureCode: code}, nil
}

func (w *paymentRun) setStatus(ctx workflow.Context, s payment.Status) {
	w.status = s
	if err := workflow.UpsertTypedSearchAttributes(ctx, SearchPaymentStatus.ValueSet(string(s))); err != nil {
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
