// Package activities performs the payment workflow's side effects, one method per step, and
// classifies every failure as retryable or not for the workflow.
package activities

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/workflows"
)

// Store is the slice of the database the steps need.
type Store interface {
	Payment(ctx context.Context, id uuid.UUID) (payment.Payment, error)
	Refund(ctx context.Context, id uuid.UUID) (payment.Refund, error)
	Reserve(ctx context.Context, operationID uuid.UUID) error
	ReserveRun(ctx context.Context, operationID uuid.UUID, runID string) error
	Finalize(ctx context.Context, operationID uuid.UUID, providerRef string) (payment.Payment, error)
	Release(ctx context.Context, operationID uuid.UUID, failureCode string) (payment.Payment, error)
	MarkUnknown(ctx context.Context, operationID uuid.UUID) (payment.Payment, error)
	MarkAuthorizationUnknown(ctx context.Context, operationID uuid.UUID) (payment.Payment, error)
	BeginChargeAttempt(ctx context.Context, operationID uuid.UUID) (int, error)
	BeginChargeSend(ctx context.Context, operationID uuid.UUID, send int) (bool, error)
	FlagStuck(ctx context.Context, operationID uuid.UUID, reason string) error
	Authorized(ctx context.Context, operationID uuid.UUID, providerRef string) (payment.Payment, error)
	// Now is the database's clock.
	Now(ctx context.Context) (time.Time, error)
	Captured(ctx context.Context, operationID uuid.UUID, amount int64, providerRef string, command uuid.UUID) (payment.Payment, error)
	Canceled(ctx context.Context, operationID uuid.UUID, code string, command uuid.UUID) (payment.Payment, error)
	CaptureAmountsInFlight(ctx context.Context, paymentID uuid.UUID) ([]int64, error)

	HoldRefund(ctx context.Context, refundID uuid.UUID) error
	HoldRefundRun(ctx context.Context, refundID uuid.UUID, runID string) error
	PostRefund(ctx context.Context, refundID uuid.UUID, providerRef string) (payment.Refund, error)
	ReleaseRefund(ctx context.Context, refundID uuid.UUID, failureCode string) (payment.Refund, error)
	MarkRefundUnknown(ctx context.Context, refundID uuid.UUID) (payment.Refund, error)
	BeginRefundAttempt(ctx context.Context, refundID uuid.UUID) (int, error)
	BeginRefundSend(ctx context.Context, refundID uuid.UUID, send int) (bool, error)
	FlagRefundStuck(ctx context.Context, refundID uuid.UUID, reason string) error
}

// Provider is the bank.
type Provider interface {
	Charge(ctx context.Context, idempotencyKey string, r provider.ChargeRequest) (provider.Charge, error)
	Inquire(ctx context.Context, reference string) (provider.Charge, error)
	Refund(ctx context.Context, idempotencyKey string, r provider.RefundRequest) (provider.Refund, error)
	InquireRefund(ctx context.Context, reference string) (provider.Refund, error)
	Authorize(ctx context.Context, idempotencyKey string, r provider.ChargeRequest) (provider.Authorization, error)
	InquireAuthorization(ctx context.Context, reference string) (provider.Authorization, error)
	Capture(ctx context.Context, idempotencyKey, authorizationID string, amountMinor int64) (provider.CaptureResult, error)
	Void(ctx context.Context, idempotencyKey, authorizationID string) (provider.VoidResult, error)
}

// Activities are registered on the worker under the names in package workflows.
type Activities struct {
	Store    Store
	Provider Provider
	// Policy is this worker's own charge policy: the workflows it runs ask for it, and a send
	// never goes out under a strategy riskier than its Capability, whatever the workflow says.
	Policy workflows.ChargePolicy
}

// ChargePolicy answers the workflow's question of how to send to the bank. A worker that names
// no capability answers none, the one that never re-sends.
func (a *Activities) ChargePolicy(context.Context) (workflows.ChargePolicy, error) {
	p := a.Policy
	if p.Capability == "" {
		p.Capability = workflows.CapabilityNone
	}
	return p, nil
}

// ReserveFunds holds the amount on the payer's account.
func (a *Activities) ReserveFunds(ctx context.Context, operationID uuid.UUID) error {
	return classify(a.Store.Reserve(ctx, operationID))
}

// Reserve is ReserveFunds naming the workflow run it is a step of: a payment another run already
// decided is refused (ErrTypeInconsistent), the same run's step executed again is not.
func (a *Activities) Reserve(ctx context.Context, operationID uuid.UUID) error {
	return classify(a.Store.ReserveRun(ctx, operationID, activity.GetInfo(ctx).WorkflowExecution.RunID))
}

// Charge asks the provider to move the money, with the operation id as idempotency key.
//
// A repeated attempt (a local activity run again after its worker died) must not do what the
// capability forbids: with "none" it never re-sends (the payment becomes unknown), with
// "inquiry" it asks the provider first and never re-sends itself: the earlier attempt's charge
// may be booked late, and only the workflow, after the booking window, may send again. So for
// those two every send is recorded before it goes out. An idempotent provider answers a
// re-send with the first result, so it needs no record.
//
// What is sent is the payment row's: the amount its hold was made for. An input that says
// otherwise is a contradiction for an operator, and nothing is sent.
func (a *Activities) Charge(ctx context.Context, in workflows.ChargeInput) (workflows.ChargeResult, error) {
	return a.send(ctx, in, "charge", a.InquireCharge, func(p payment.Payment) (string, bool, error) {
		ch, err := a.Provider.Charge(ctx, p.ID.String(), chargeRequest(p))
		return ch.ID, ch.Succeeded(), err
	})
}

func chargeRequest(p payment.Payment) provider.ChargeRequest {
	return provider.ChargeRequest{Reference: p.ID.String(), AmountMinor: p.AmountMinor, Currency: p.Currency, AccountID: p.AccountID.String()}
}

// send is Charge's and Authorize's flow: the payment checked against the input, a repeated
// send guarded, and the bank's answer classified. do makes the call, returning the bank's
// reference and whether it succeeded.
func (a *Activities) send(ctx context.Context, in workflows.ChargeInput, noun string,
	inquire func(context.Context, uuid.UUID) (workflows.ChargeResult, error),
	do func(p payment.Payment) (string, bool, error)) (workflows.ChargeResult, error) {
	p, err := a.Store.Payment(ctx, in.OperationID)
	if err != nil {
		return workflows.ChargeResult{}, notSent(classifyRow(err))
	}
	if p.AmountMinor != in.AmountMinor || p.Currency != in.Currency || p.AccountID != in.AccountID {
		return workflows.ChargeResult{}, inconsistent(fmt.Sprintf("the charge of payment %s names %d %s from %s; the payment is %d %s from %s",
			p.ID, in.AmountMinor, in.Currency, in.AccountID, p.AmountMinor, p.Currency, p.AccountID))
	}
	// An earlier attempt's answer already written to the payment (its workflow task, lost with
	// Temporal, runs its steps again) is that answer: nothing is sent, and nothing guessed.
	switch {
	case p.Status == payment.StatusFailed && p.FailureCode == payment.FailureDeclined:
		return answer(noun, "", false, nil)
	case p.Status != payment.StatusProcessing && p.Status != payment.StatusUnknown && p.ProviderReference != "":
		return answer(noun, p.ProviderReference, true, nil)
	}
	res, stop, err := a.guardSend(ctx, in.OperationID, in.Capability, in.Send, in.Resend, sendRecord{
		noun: noun, attempt: a.Store.BeginChargeAttempt, send: a.Store.BeginChargeSend, inquire: inquire,
	})
	if stop {
		return res, err
	}
	ref, ok, err := do(p)
	return answer(noun, ref, ok, err)
}

// answer classifies the bank's answer to a send: a decline is final, anything but a definite
// answer is ambiguous.
func answer(noun, ref string, succeeded bool, err error) (workflows.ChargeResult, error) {
	if err != nil {
		return workflows.ChargeResult{}, classify(err)
	}
	if !succeeded {
		return workflows.ChargeResult{}, temporal.NewNonRetryableApplicationError(noun+" declined", workflows.ErrTypeDeclined, nil, ref)
	}
	return workflows.ChargeResult{ProviderReference: ref, Succeeded: true}, nil
}

// sendRecord is how one kind of operation records its sends and asks the provider about them.
type sendRecord struct {
	noun    string
	attempt func(ctx context.Context, id uuid.UUID) (int, error)
	send    func(ctx context.Context, id uuid.UUID, send int) (bool, error)
	inquire func(ctx context.Context, id uuid.UUID) (workflows.ChargeResult, error)
}

// guardSend records a send about to go out for the capabilities that need it and decides what a
// repeated one may do. stop says the send must not go out: res and err are then the answer.
func (a *Activities) guardSend(ctx context.Context, id uuid.UUID, c workflows.Capability, send int, re workflows.Resend, r sendRecord) (res workflows.ChargeResult, stop bool, err error) {
	// Empty: a history from before local steps, whose send is a regular activity that Temporal
	// retries as the strategy it recorded allows, which the input does not say: the worker's
	// own strategy governs its retries.
	c = workflows.Safer(c, a.Policy.Capability)
	if c != workflows.CapabilityNone && c != workflows.CapabilityInquiry {
		return res, false, nil
	}
	if c == workflows.CapabilityNone && send > 1 { // the workflow's re-send, under inquiry's strategy
		return res, true, temporal.NewNonRetryableApplicationError(
			"an earlier send of this "+r.noun+" may have reached the provider, and this worker's capability (none) allows no re-send",
			workflows.ErrTypeAmbiguous, nil)
	}
	if err := a.guardBooking(r.noun, re); err != nil {
		return res, true, err
	}
	var repeat bool
	if send > 0 {
		first, err := r.send(ctx, id, send)
		if err != nil {
			return res, true, notSent(classify(err))
		}
		repeat = !first
	} else {
		attempt, err := r.attempt(ctx, id)
		if err != nil {
			return res, true, notSent(classify(err))
		}
		repeat = attempt > 1
	}
	if !repeat {
		return res, false, nil
	}
	if c == workflows.CapabilityNone {
		return res, true, temporal.NewNonRetryableApplicationError(
			"an earlier attempt of this "+r.noun+" may have reached the provider, which cannot be asked",
			workflows.ErrTypeAmbiguous, nil)
	}
	res, err = r.inquire(ctx, id)
	if !hasType(err, workflows.ErrTypeNotFound) {
		return res, true, err // the earlier attempt's operation, or no answer yet: never re-send
	}
	if send > 0 {
		return workflows.ChargeResult{}, true, temporal.NewNonRetryableApplicationError(
			"an earlier attempt of this "+r.noun+" is not booked yet, and may still be", workflows.ErrTypeAmbiguous, nil)
	}
	return workflows.ChargeResult{}, false, nil // before numbered sends: nothing was found, send
}

// InquireCharge asks the provider whether a charge exists for the operation.
func (a *Activities) InquireCharge(ctx context.Context, operationID uuid.UUID) (workflows.ChargeResult, error) {
	ch, err := a.Provider.Inquire(ctx, operationID.String())
	if err == nil {
		err = a.samePaymentMoney(ctx, operationID, ch.AmountMinor, ch.Currency)
	}
	if err != nil {
		return workflows.ChargeResult{}, classify(err)
	}
	return workflows.ChargeResult{ProviderReference: ch.ID, Succeeded: ch.Succeeded()}, nil
}

// samePaymentMoney checks the money an inquiry's answer names (if any) against the payment's:
// the bank's record of other money is not this payment's answer (provider.CheckMoney).
func (a *Activities) samePaymentMoney(ctx context.Context, id uuid.UUID, amountMinor int64, currency string) error {
	if amountMinor == 0 && currency == "" {
		return nil
	}
	p, err := a.Store.Payment(ctx, id)
	if err != nil {
		return err
	}
	return provider.CheckMoney(amountMinor, currency, p.AmountMinor, p.Currency)
}

func hasType(err error, typ string) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == typ
}

// Finalize captures the payment in the ledger.
func (a *Activities) Finalize(ctx context.Context, in workflows.FinalizeInput) error {
	_, err := a.Store.Finalize(ctx, in.OperationID, in.ProviderReference)
	return classify(err)
}

// Release fails the payment and returns its reservation.
func (a *Activities) Release(ctx context.Context, in workflows.ReleaseInput) error {
	_, err := a.Store.Release(ctx, in.OperationID, in.FailureCode)
	return classify(err)
}

// MarkUnknown parks the payment for reconciliation.
func (a *Activities) MarkUnknown(ctx context.Context, operationID uuid.UUID) error {
	_, err := a.Store.MarkUnknown(ctx, operationID)
	if errors.Is(err, payment.ErrInconsistent) {
		// Found final: another run decided the payment while this one sent. The refusal names the
		// status, with which a run of Revision 9 on ends.
		if p, perr := a.Store.Payment(ctx, operationID); perr == nil && p.Status.Final() {
			return temporal.NewNonRetryableApplicationError(err.Error(), workflows.ErrTypeInconsistent, err, string(p.Status))
		}
	}
	return classify(err)
}

// MarkAuthorizationUnknown parks a manual payment whose authorization got no answer. One that
// another run has authorized or decided meanwhile is refused (ErrTypeInconsistent) with its
// status, and a recorded authorization's reference, in the details: the run takes it on.
func (a *Activities) MarkAuthorizationUnknown(ctx context.Context, operationID uuid.UUID) error {
	_, err := a.Store.MarkAuthorizationUnknown(ctx, operationID)
	if errors.Is(err, payment.ErrInconsistent) {
		p, perr := a.Store.Payment(ctx, operationID)
		switch {
		case perr == nil && p.Status.Final():
			return temporal.NewNonRetryableApplicationError(err.Error(), workflows.ErrTypeInconsistent, err, string(p.Status))
		case perr == nil && p.Status == payment.StatusRequiresCapture:
			return temporal.NewNonRetryableApplicationError(err.Error(), workflows.ErrTypeInconsistent, err, string(p.Status), p.ProviderReference)
		}
	}
	return classify(err)
}

// ReadPaymentStatus reads the payment's status and bank reference; it changes nothing.
func (a *Activities) ReadPaymentStatus(ctx context.Context, operationID uuid.UUID) (workflows.StatusRead, error) {
	p, err := a.Store.Payment(ctx, operationID)
	return workflows.StatusRead{Status: string(p.Status), ProviderReference: p.ProviderReference}, classifyRow(err)
}

// FlagStuck marks the payment as needing an operator (an empty reason clears the mark).
func (a *Activities) FlagStuck(ctx context.Context, in workflows.FlagInput) error {
	return classify(a.Store.FlagStuck(ctx, in.OperationID, in.Reason))
}

// HoldRefund holds the refund's amount on the merchant's settlement account.
func (a *Activities) HoldRefund(ctx context.Context, refundID uuid.UUID) error {
	return classify(a.Store.HoldRefund(ctx, refundID))
}

// HoldRefundForRun is HoldRefund naming the workflow run it is a step of: a refund another run
// already decided is refused (ErrTypeInconsistent), the same run's step executed again is not.
func (a *Activities) HoldRefundForRun(ctx context.Context, refundID uuid.UUID) error {
	return classify(a.Store.HoldRefundRun(ctx, refundID, activity.GetInfo(ctx).WorkflowExecution.RunID))
}

// SendRefund asks the bank to pay the refund back, with the refund's id as idempotency key and
// the payment's id as the charge's reference. A repeated attempt is guarded as Charge's is: with
// capability none or inquiry the send is recorded before it goes out, so that the bank never
// gets a second refund it cannot recognise as the first.
func (a *Activities) SendRefund(ctx context.Context, in workflows.SendRefundInput) (workflows.RefundSendResult, error) {
	rf, err := a.Store.Refund(ctx, in.OperationID)
	if err != nil {
		return workflows.RefundSendResult{}, notSent(classifyRow(err))
	}
	if rf.AmountMinor != in.AmountMinor || rf.Currency != in.Currency || rf.PaymentID != in.PaymentID {
		return workflows.RefundSendResult{}, inconsistent(fmt.Sprintf("the send of refund %s names %d %s of payment %s; the refund is %d %s of payment %s",
			rf.ID, in.AmountMinor, in.Currency, in.PaymentID, rf.AmountMinor, rf.Currency, rf.PaymentID))
	}
	// An earlier attempt's answer already written to the refund is that answer, as for a charge.
	switch {
	case rf.Status == payment.StatusFailed && rf.FailureCode == payment.FailureDeclined:
		return workflows.RefundSendResult{}, temporal.NewNonRetryableApplicationError("refund declined", workflows.ErrTypeDeclined, nil, rf.ProviderReference)
	case rf.Status != payment.StatusProcessing && rf.Status != payment.StatusUnknown && rf.ProviderReference != "":
		return workflows.RefundSendResult{ProviderReference: rf.ProviderReference, Succeeded: true}, nil
	}
	res, stop, err := a.guardSend(ctx, in.OperationID, in.Capability, in.Send, in.Resend, sendRecord{
		noun: "refund", attempt: a.Store.BeginRefundAttempt, send: a.Store.BeginRefundSend,
		inquire: func(ctx context.Context, id uuid.UUID) (workflows.ChargeResult, error) {
			r, err := a.InquireRefund(ctx, id)
			return workflows.ChargeResult(r), err
		},
	})
	if stop {
		return workflows.RefundSendResult(res), err
	}
	r, err := a.Provider.Refund(ctx, rf.ID.String(), provider.RefundRequest{
		Reference: rf.ID.String(), ChargeReference: rf.PaymentID.String(), AmountMinor: rf.AmountMinor, Currency: rf.Currency,
	})
	if err != nil {
		return workflows.RefundSendResult{}, classify(err)
	}
	if r.Status == provider.StatusDeclined {
		return workflows.RefundSendResult{}, temporal.NewNonRetryableApplicationError("refund declined", workflows.ErrTypeDeclined, nil, r.ID)
	}
	return workflows.RefundSendResult{ProviderReference: r.ID, Succeeded: true}, nil
}

// InquireRefund asks the bank whether a refund exists for the refund's id.
func (a *Activities) InquireRefund(ctx context.Context, refundID uuid.UUID) (workflows.RefundSendResult, error) {
	r, err := a.Provider.InquireRefund(ctx, refundID.String())
	if err == nil && (r.AmountMinor != 0 || r.Currency != "") {
		var rf payment.Refund
		if rf, err = a.Store.Refund(ctx, refundID); err == nil {
			err = provider.CheckMoney(r.AmountMinor, r.Currency, rf.AmountMinor, rf.Currency)
		}
	}
	if err != nil {
		return workflows.RefundSendResult{}, classify(err)
	}
	return workflows.RefundSendResult{ProviderReference: r.ID, Succeeded: r.Succeeded()}, nil
}

// PostRefund books the refund the bank made in the ledger.
func (a *Activities) PostRefund(ctx context.Context, in workflows.PostRefundInput) error {
	_, err := a.Store.PostRefund(ctx, in.OperationID, in.ProviderReference)
	return classify(err)
}

// ReleaseRefund fails the refund and gives back its holds.
func (a *Activities) ReleaseRefund(ctx context.Context, in workflows.ReleaseRefundInput) error {
	_, err := a.Store.ReleaseRefund(ctx, in.OperationID, in.FailureCode)
	return classify(err)
}

// MarkRefundUnknown parks the refund for reconciliation, its holds kept.
func (a *Activities) MarkRefundUnknown(ctx context.Context, refundID uuid.UUID) error {
	_, err := a.Store.MarkRefundUnknown(ctx, refundID)
	return classify(err)
}

// ReadRefundStatus reads the refund's status and bank reference; it changes nothing.
func (a *Activities) ReadRefundStatus(ctx context.Context, refundID uuid.UUID) (workflows.StatusRead, error) {
	r, err := a.Store.Refund(ctx, refundID)
	return workflows.StatusRead{Status: string(r.Status), ProviderReference: r.ProviderReference}, classifyRow(err)
}

// FlagRefundStuck marks the refund as needing an operator (an empty reason clears the mark).
func (a *Activities) FlagRefundStuck(ctx context.Context, in workflows.FlagInput) error {
	return classify(a.Store.FlagRefundStuck(ctx, in.OperationID, in.Reason))
}

// classify turns errors into application errors with stable types; anything unrecognised stays
// retryable (a database outage must delay a payment, never fail it).
// classifyRow is classify for reading the operation's own row: a row that is not there
// contradicts the step.
func classifyRow(err error) error {
	if errors.Is(err, payment.ErrNotFound) {
		return inconsistent(err.Error())
	}
	return classify(err)
}

// notSent marks a database error met before a send went out: nothing reached the bank, so the
// workflow (Revision 9 on) sends again rather than park the operation unknown. A send whose
// record did commit, its answer lost, is a repeat on that next try, answered by the
// capability's rules. Errors that say something definite keep their own type.
func notSent(err error) error {
	var typed *temporal.ApplicationError
	if err == nil || errors.As(err, &typed) {
		return err
	}
	return temporal.NewApplicationErrorWithCause(err.Error(), workflows.ErrTypeNotSent, err)
}

func inconsistent(msg string) error {
	return temporal.NewNonRetryableApplicationError(msg, workflows.ErrTypeInconsistent, nil)
}

func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, payment.ErrInsufficientFunds):
		return temporal.NewNonRetryableApplicationError(err.Error(), workflows.ErrTypeInsufficientFunds, err)
	case errors.Is(err, provider.ErrNotFound):
		return temporal.NewNonRetryableApplicationError(err.Error(), workflows.ErrTypeNotFound, err)
	case errors.Is(err, provider.ErrInquiryUnsupported):
		return temporal.NewNonRetryableApplicationError(err.Error(), workflows.ErrTypeInquiryNotAllowed, err)
	case errors.Is(err, provider.ErrAmbiguous):
		return temporal.NewApplicationErrorWithCause(err.Error(), workflows.ErrTypeAmbiguous, err)
	case errors.As(err, new(*payment.DecidedError)):
		var d *payment.DecidedError
		errors.As(err, &d)
		return temporal.NewNonRetryableApplicationError(err.Error(), workflows.ErrTypeAlreadyDecided, err, string(d.Status), d.RunOfRecord)
	case errors.Is(err, payment.ErrInconsistent):
		return temporal.NewNonRetryableApplicationError(err.Error(), workflows.ErrTypeInconsistent, err)
	}
	return err
}

// Authorize asks the bank to hold a manual payment's amount, sent as Charge sends a charge: the
// operation id is its idempotency key and its reference.
func (a *Activities) Authorize(ctx context.Context, in workflows.ChargeInput) (workflows.ChargeResult, error) {
	return a.send(ctx, in, "authorization", a.InquireAuthorization, func(p payment.Payment) (string, bool, error) {
		au, err := a.Provider.Authorize(ctx, p.ID.String(), chargeRequest(p))
		return au.ID, au.Succeeded(), err
	})
}

// InquireAuthorization asks the bank whether it holds an authorization for the operation.
func (a *Activities) InquireAuthorization(ctx context.Context, operationID uuid.UUID) (workflows.ChargeResult, error) {
	au, err := a.Provider.InquireAuthorization(ctx, operationID.String())
	if err == nil {
		err = a.samePaymentMoney(ctx, operationID, au.AmountMinor, au.Currency)
	}
	if err != nil {
		return workflows.ChargeResult{}, classify(err)
	}
	return workflows.ChargeResult{ProviderReference: au.ID, Succeeded: au.Succeeded()}, nil
}

// Authorized records the authorization: the payment waits for its capture. It answers the
// database's clock, read once the record is committed: the clock that stamped capture_before.
func (a *Activities) Authorized(ctx context.Context, in workflows.FinalizeInput) (workflows.AuthorizedResult, error) {
	if _, err := a.Store.Authorized(ctx, in.OperationID, in.ProviderReference); err != nil {
		return workflows.AuthorizedResult{}, classify(err)
	}
	now, err := a.Store.Now(ctx)
	if err != nil {
		return workflows.AuthorizedResult{}, classify(err)
	}
	return workflows.AuthorizedResult{DatabaseNow: now}, nil
}

// Bank keys of a manual payment's capture and void: there is at most one of each per payment,
// so a key made of the payment's id is the same for every send of it, by any worker.
func captureKey(id uuid.UUID) string { return id.String() + "/capture" }
func voidKey(id uuid.UUID) string    { return id.String() + "/void" }

// CaptureAuthorization asks the bank to take the amount of the authorization; the bank lets the
// rest go. It runs as a regular activity: one attempt unless the bank is idempotent.
func (a *Activities) CaptureAuthorization(ctx context.Context, in workflows.BankCallInput) (workflows.ChargeResult, error) {
	if err := a.guardRetry(ctx, "capture", in.Send, in.Resend); err != nil {
		return workflows.ChargeResult{}, err
	}
	ref, err := a.authorization(ctx, in)
	if err != nil {
		return workflows.ChargeResult{}, err
	}
	c, err := a.Provider.Capture(ctx, captureKey(in.OperationID), ref, in.AmountMinor)
	if err == nil {
		err = aboutPayment(c.Reference, in.OperationID)
	}
	return answer("capture", c.ID, c.Succeeded(), err)
}

// aboutPayment checks the reference a capture or void answer names (if any), its
// authorization's: one of another payment says the authorization id sent (a settlement's, maybe
// mistyped) is not this payment's, so the answer decides nothing of it.
func aboutPayment(reference string, id uuid.UUID) error {
	if reference != "" && reference != id.String() {
		return fmt.Errorf("%w: the answer is about the authorization of %.100q, not of payment %s", provider.ErrAmbiguous, reference, id)
	}
	return nil
}

// guardBooking holds a re-send back while the earlier send may still be booked by this worker's
// booking window, when it is longer than the one the workflow waited out.
func (a *Activities) guardBooking(noun string, re workflows.Resend) error {
	if re.PreviousEnded.IsZero() || a.Policy.BookingWindow <= re.Waited {
		return nil
	}
	left := time.Until(re.PreviousEnded.Add(a.Policy.BookingWindow))
	if re.Since > 0 { // measured by the clock that stamped PreviousEnded, not this host's
		left = a.Policy.BookingWindow - re.Since
	}
	if left > 0 {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("the earlier send of this %s may still be booked: this worker's "+
			"booking window (%s) is longer than the %s waited, and has %s to run", noun, a.Policy.BookingWindow, re.Waited, left.Round(time.Second)),
			workflows.ErrTypeAmbiguous, nil)
	}
	return nil
}

// guardRetry keeps a capture or void to the stricter of two policies. Temporal retries it as the
// policy its payment recorded allows (idempotent), and the workflow sends it again after an
// inquiry found nothing (inquiry); a worker whose own bank is not idempotent takes no retry, and
// one whose bank cannot be asked (none) takes no second send, as the first may have reached it.
func (a *Activities) guardRetry(ctx context.Context, noun string, send int, re workflows.Resend) error {
	c := a.Policy.Capability
	if c == workflows.CapabilityIdempotent {
		return nil
	}
	if activity.GetInfo(ctx).Attempt <= 1 && (send <= 1 || c == workflows.CapabilityInquiry) {
		return a.guardBooking(noun, re)
	}
	return temporal.NewNonRetryableApplicationError(fmt.Sprintf("an earlier attempt of this %s may have reached the bank, "+
		"and this worker's capability (%q) does not allow sending it again", noun, c), workflows.ErrTypeAmbiguous, nil)
}

// authorization is the bank's id of the payment's authorization: the workflow's, or, when a
// settlement named none, the bank's answer to an inquiry (ambiguous when it cannot be asked).
func (a *Activities) authorization(ctx context.Context, in workflows.BankCallInput) (string, error) {
	if in.AuthorizationRef != "" {
		return in.AuthorizationRef, nil
	}
	au, err := a.Provider.InquireAuthorization(ctx, in.OperationID.String())
	if err != nil {
		return "", temporal.NewNonRetryableApplicationError("the authorization's id at the bank is not known: "+err.Error(), workflows.ErrTypeAmbiguous, nil)
	}
	return au.ID, nil
}

// InquireCapture asks the bank whether the payment's authorization was captured: not yet (so a
// capture may be sent) is ChargeNotFound, voided is a decline.
func (a *Activities) InquireCapture(ctx context.Context, operationID uuid.UUID) (workflows.ChargeResult, error) {
	return a.inquireState(ctx, operationID, provider.StateCaptured)
}

// capturedAsAsked checks a captured authorization's money against the payment's and its capture
// in flight: the workflow posts the amount it asked for, so a bank that names another amount has
// not said that the capture kasa sent moved the money.
func (a *Activities) capturedAsAsked(ctx context.Context, operationID uuid.UUID, au provider.Authorization) error {
	if err := a.samePaymentMoney(ctx, operationID, au.AmountMinor, au.Currency); err != nil || au.CapturedMinor == 0 {
		return err
	}
	asked, err := a.Store.CaptureAmountsInFlight(ctx, operationID)
	if err != nil || slices.Contains(asked, au.CapturedMinor) {
		return err
	}
	return fmt.Errorf("%w: the bank captured %d minor units of authorization %s, and no capture in flight asked for that",
		provider.ErrAmbiguous, au.CapturedMinor, au.ID)
}

// VoidAuthorization asks the bank to let the authorization go. A void the bank refuses is not a
// decline kasa can act on: ErrTypeCapturedAtBank when the bank says it captured, else ambiguous.
func (a *Activities) VoidAuthorization(ctx context.Context, in workflows.BankCallInput) (workflows.ChargeResult, error) {
	if err := a.guardRetry(ctx, "void", in.Send, in.Resend); err != nil {
		return workflows.ChargeResult{}, err
	}
	ref, err := a.authorization(ctx, in)
	if err != nil {
		return workflows.ChargeResult{}, err
	}
	v, err := a.Provider.Void(ctx, voidKey(in.OperationID), ref)
	if err == nil {
		err = aboutPayment(v.Reference, in.OperationID)
	}
	if err == nil && !v.Succeeded() {
		// Refused because it captured is the bank's definite answer that the money moved; a bank
		// that can be asked says so. Any other refusal stays ambiguous.
		if au, ierr := a.Provider.InquireAuthorization(ctx, in.OperationID.String()); ierr == nil && au.State == provider.StateCaptured {
			return workflows.ChargeResult{}, temporal.NewNonRetryableApplicationError(
				"the bank refused to void the authorization "+au.ID+": it captured it", workflows.ErrTypeCapturedAtBank, nil, au.ID)
		}
		return workflows.ChargeResult{}, temporal.NewNonRetryableApplicationError(
			"the bank refused to void the authorization "+ref, workflows.ErrTypeAmbiguous, nil)
	}
	return answer("void", v.ID, v.Succeeded(), err)
}

// InquireVoid asks the bank whether the payment's authorization was voided.
func (a *Activities) InquireVoid(ctx context.Context, operationID uuid.UUID) (workflows.ChargeResult, error) {
	return a.inquireState(ctx, operationID, provider.StateVoided)
}

// inquireState finds the payment's authorization at the bank: in state want it succeeded, still
// authorized it is not found (the call may be sent), in a state that holds nothing (declined,
// or let go without a capture) it declined. A void finding the authorization captured is
// ErrTypeCapturedAtBank: the bank took the money, so the hold must stay for an operator, where a
// decline would release it. Any other state (none, or one kasa does not know) says nothing of
// the capture or the void: ambiguous.
func (a *Activities) inquireState(ctx context.Context, operationID uuid.UUID, want string) (workflows.ChargeResult, error) {
	au, err := a.Provider.InquireAuthorization(ctx, operationID.String())
	switch {
	case err != nil:
		return workflows.ChargeResult{}, classify(err)
	case au.State == want && want == provider.StateCaptured:
		if err := a.capturedAsAsked(ctx, operationID, au); err != nil {
			return workflows.ChargeResult{}, classify(err)
		}
		return workflows.ChargeResult{ProviderReference: au.ID, Succeeded: true}, nil
	case au.State == want, want == provider.StateVoided && au.State == provider.StateExpired: // an expired hold is let go too
		return workflows.ChargeResult{ProviderReference: au.ID, Succeeded: true}, nil
	case au.State == provider.StateAuthorized:
		return workflows.ChargeResult{}, temporal.NewNonRetryableApplicationError("the authorization is still open", workflows.ErrTypeNotFound, nil)
	case want == provider.StateVoided && au.State == provider.StateCaptured:
		return workflows.ChargeResult{}, temporal.NewNonRetryableApplicationError(
			"the bank captured the authorization "+au.ID+" that kasa is voiding", workflows.ErrTypeCapturedAtBank, nil, au.ID)
	case au.State == provider.StateDeclined, au.State == provider.StateVoided, au.State == provider.StateExpired:
		return workflows.ChargeResult{}, temporal.NewNonRetryableApplicationError("the authorization is "+au.State, workflows.ErrTypeDeclined, nil, au.ID)
	}
	return workflows.ChargeResult{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("the bank's authorization %s is in a state kasa cannot read (%q)",
		au.ID, au.State), workflows.ErrTypeAmbiguous, nil)
}

// Captured posts the capture in the ledger and releases the rest of the hold.
func (a *Activities) Captured(ctx context.Context, in workflows.CapturedInput) error {
	_, err := a.Store.Captured(ctx, in.OperationID, in.AmountMinor, in.ProviderReference, in.CommandID)
	return classify(err)
}

// Canceled releases the hold of a canceled (or expired) authorization.
func (a *Activities) Canceled(ctx context.Context, in workflows.ReleaseInput) error {
	_, err := a.Store.Canceled(ctx, in.OperationID, in.FailureCode, in.CommandID)
	return classify(err)
}
