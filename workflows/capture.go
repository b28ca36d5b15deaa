package workflows

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/payment"
)

// runManual is a manual payment (docs/api.md, "Authorize now, capture later"): reserve and
// authorize as a charge is sent; then wait in requires_capture for the merchant's capture or
// cancel, or for CaptureBefore; then capture (the rest of the hold is released) or void. Each
// bank call follows the capability's strategy, and an ambiguous one parks the payment unknown,
// its hold kept, until a settlement says what the bank did.
func (w *opRun) runManual(ctx workflow.Context) (PaymentResult, error) {
	if err := w.setCommandHandlers(ctx); err != nil {
		return PaymentResult{}, err
	}
	w.enter(w.in.Step)
	w.voidAt = w.in.CaptureBefore
	res, err := w.run(ctx)
	if err != nil || !w.authorized {
		return res, err
	}
	return w.awaitCommand(ctx, res.ProviderReference)
}

// enter sets the operation up for one phase: what is sent to the bank, and what its outcomes
// (or a settlement) write.
func (w *opRun) enter(st Step) {
	in := w.in
	if w.pending != nil { // applied by the phase before: its handler answers once this one ends
		w.consumed, w.pending = w.pending, nil
	}
	w.in.Step = st
	switch st.Phase {
	case PhaseAuthorize:
		w.op.send, w.op.inquire, w.op.post, w.op.posted = ActivityAuthorize, ActivityInquireAuthorization, ActivityAuthorized, payment.StatusRequiresCapture
	case PhaseCapture:
		w.op.send, w.op.inquire, w.op.post, w.op.remote = ActivityCaptureAuthorization, ActivityInquireCapture, ActivityCaptured, true
		w.op.posted = payment.StatusSucceeded
		w.op.sendArg = func(send int, re Resend) any {
			return BankCallInput{OperationID: in.OperationID, AuthorizationRef: st.AuthorizationRef, AmountMinor: st.AmountMinor, Send: send, Resend: re}
		}
		w.op.postArg = func(string) any {
			return CapturedInput{OperationID: in.OperationID, AmountMinor: st.AmountMinor, ProviderReference: st.AuthorizationRef, CommandID: st.CommandID}
		}
		// The bank took nothing: let the authorization go, as a cancel does.
		w.op.failed = func(ctx workflow.Context, code string) (PaymentResult, error) {
			return w.void(ctx, Step{Phase: PhaseVoid, AuthorizationRef: st.AuthorizationRef, FailureCode: code, CommandID: st.CommandID})
		}
	case PhaseVoid:
		w.op.send, w.op.inquire, w.op.remote, w.op.failed = ActivityVoidAuthorization, ActivityInquireVoid, true, nil
		w.op.post, w.op.release = ActivityCanceled, ActivityCanceled
		w.op.posted, w.op.released = payment.StatusCanceled, payment.StatusCanceled
		w.op.sendArg = func(send int, re Resend) any {
			return BankCallInput{OperationID: in.OperationID, AuthorizationRef: st.AuthorizationRef, Send: send, Resend: re}
		}
		canceled := func(string) any {
			return ReleaseInput{OperationID: in.OperationID, FailureCode: st.FailureCode, CommandID: st.CommandID}
		}
		w.op.postArg, w.op.releaseArg = canceled, canceled
	}
}

// awaitCommand waits in requires_capture for the merchant's command or the end of the capture
// window, then sends the capture or the void.
func (w *opRun) awaitCommand(ctx workflow.Context, authorization string) (PaymentResult, error) {
	w.detail(ctx, "authorized (%s): waiting for a capture or a cancel until %s, when the authorization is voided",
		authorization, stamp(w.in.CaptureBefore))
	if wait := w.voidAt.Sub(workflow.Now(ctx)); wait > 0 {
		if _, err := workflow.AwaitWithTimeout(ctx, wait, func() bool { return w.command != nil }); err != nil {
			return PaymentResult{}, err
		}
	}
	switch {
	case w.command == nil:
		w.expired = true // no command is taken from now on: the authorization is being let go
		return w.void(ctx, Step{Phase: PhaseVoid, AuthorizationRef: authorization, FailureCode: payment.FailureAuthorizationExpired})
	case w.cancel:
		return w.void(ctx, Step{Phase: PhaseVoid, AuthorizationRef: authorization, FailureCode: payment.FailureCanceled, CommandID: w.command.ID})
	}
	amount := w.command.AmountMinor
	if amount == 0 {
		amount = w.in.AmountMinor
	}
	w.enter(Step{Phase: PhaseCapture, AuthorizationRef: authorization, AmountMinor: amount, CommandID: w.command.ID})
	res, err := w.charge(ctx)
	return w.outcome(ctx, res, err)
}

// recordedAt sets voidAt from the database's clock when the authorization was recorded
// (Revision 9): capture_before is that clock's time, and the Temporal Server's, which times the
// run, may be minutes off it. The capture window's time left by the database's clock is waited
// from this run's now: a Temporal clock ahead voided early, one behind voided late.
func (w *opRun) recordedAt(ctx workflow.Context, databaseNow time.Time) {
	if w.in.Revision >= 9 && !databaseNow.IsZero() {
		w.voidAt = workflow.Now(ctx).Add(w.in.CaptureBefore.Sub(databaseNow))
	}
}

// void sends the void of the authorization and cancels the payment.
func (w *opRun) void(ctx workflow.Context, st Step) (PaymentResult, error) {
	w.enter(st)
	res, err := w.charge(ctx)
	return w.outcome(ctx, res, err)
}

// setCommandHandlers registers the capture and cancel updates. Their validators refuse, before
// anything is written, what the payment cannot do now; the handlers answer with the status the
// command led to (unknown when the bank's answer is not known).
func (w *opRun) setCommandHandlers(ctx workflow.Context) error {
	done := func(ctx workflow.Context) (string, error) {
		err := workflow.Await(uncanceled(ctx, w.in.Revision), func() bool { return w.status != payment.StatusRequiresCapture })
		return string(w.status), err
	}
	err := workflow.SetUpdateHandlerWithOptions(ctx, UpdateCapture,
		func(ctx workflow.Context, c Command) (string, error) {
			if !w.own(c) {
				w.command = &c
			}
			return done(ctx)
		},
		workflow.UpdateHandlerOptions{Validator: func(c Command) error {
			if w.own(c) {
				return nil
			}
			if err := w.waiting(ctx, ErrTypeNotCapturable); err != nil {
				return err
			}
			if c.AmountMinor < 0 || c.AmountMinor > w.in.AmountMinor {
				return temporal.NewApplicationError(fmt.Sprintf("capture of %d exceeds the capturable %d", c.AmountMinor, w.in.AmountMinor),
					ErrTypeCaptureExceeds, w.in.AmountMinor)
			}
			return nil
		}})
	if err != nil {
		return err
	}
	return workflow.SetUpdateHandlerWithOptions(ctx, UpdateCancel,
		func(ctx workflow.Context, c Command) (string, error) {
			if !w.own(c) {
				w.command, w.cancel = &c, true
			}
			return done(ctx)
		},
		workflow.UpdateHandlerOptions{Validator: func(c Command) error {
			if w.own(c) {
				return nil
			}
			return w.waiting(ctx, ErrTypeNotCancelable)
		}})
}

// own says c is the command this phase carries out, sent again: after a continue-as-new the run
// has its step but not the update, which Temporal de-duplicates only within a run. It is
// answered with the status, never refused as another command would be.
func (w *opRun) own(c Command) bool {
	return c.ID != uuid.Nil && c.ID == w.in.Step.CommandID
}

// waiting refuses a command (as errType) unless the payment waits for one. capture_before ends
// a capture's wait even before its timer is handled: a task may bring the timer and a capture
// together (a cancel then is let through: it releases the hold as the expiry would).
func (w *opRun) waiting(ctx workflow.Context, errType string) error {
	if w.in.Step.Phase == PhaseAuthorize && !w.authorized && !w.status.Final() {
		// The authorization's record may be committed (the payment reads requires_capture, its
		// create answered) before its step's answer reaches the run, as when a worker dies
		// after the commit: not a refusal, the command is sent again once the run is waiting.
		return temporal.NewApplicationError("the payment's authorization is being recorded; send the command again",
			ErrTypeAuthorizing)
	}
	late := errType == ErrTypeNotCapturable && !workflow.Now(ctx).Before(w.voidAt)
	if w.status == payment.StatusRequiresCapture && w.command == nil && !w.expired && !late {
		return nil
	}
	st := string(w.status)
	switch {
	case w.command != nil:
		st = "being captured or canceled"
	case w.expired, late && w.status == payment.StatusRequiresCapture:
		st = "past its capture_before, its authorization being voided"
	}
	return temporal.NewApplicationError("the payment is "+st+", not waiting for a capture", errType, st)
}
