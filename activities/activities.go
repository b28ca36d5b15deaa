// Package activities performs the payment workflow's side effects, one method per step, and
// classifies every failure as retryable or not for the workflow.
package activities

import (
	"context"
	"errors"

	"github.com/google/uuid"
	"go.temporal.io/sdk/temporal"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/provider"
	"github.com/kasa-pay/kasa/workflows"
)

// Store is the slice of the database the steps need.
type Store interface {
	Reserve(ctx context.Context, operationID uuid.UUID) error
	Finalize(ctx context.Context, operationID uuid.UUID, providerRef string) (payment.Payment, error)
	Release(ctx context.Context, operationID uuid.UUID, failureCode string) (payment.Payment, error)
	MarkUnknown(ctx context.Context, operationID uuid.UUID) (payment.Payment, error)
	BeginChargeAttempt(ctx context.Context, operationID uuid.UUID) (int, error)
	BeginChargeSend(ctx context.Context, operationID uuid.UUID, send int) (bool, error)
	FlagStuck(ctx context.Context, operationID uuid.UUID, reason string) error
}

// Provider is the bank.
type Provider interface {
	Charge(ctx context.Context, idempotencyKey string, r provider.ChargeRequest) (provider.Charge, error)
	Inquire(ctx context.Context, reference string) (provider.Charge, error)
}

// Activities are registered on the worker under the names in package workflows.
type Activities struct {
	Store    Store
	Provider Provider
}

// ReserveFunds holds the amount on the payer's account.
func (a *Activities) ReserveFunds(ctx context.Context, operationID uuid.UUID) error {
	return classify(a.Store.Reserve(ctx, operationID))
}

// Charge asks the provider to move the money, with the operation id as idempotency key.
//
// A repeated attempt (a local activity run again after its worker died) must not do what the
// capability forbids: with "none" it never re-sends (the payment becomes unknown), with
// "inquiry" it asks the provider first and never re-sends itself: the earlier attempt's charge
// may be booked late, and only the workflow, after the booking window, may send again. So for
// those two every send is recorded before it goes out. An idempotent provider answers a
// re-send with the first result, so it needs no record.
func (a *Activities) Charge(ctx context.Context, in workflows.ChargeInput) (workflows.ChargeResult, error) {
	if in.Capability == workflows.CapabilityNone || in.Capability == workflows.CapabilityInquiry {
		repeat, err := a.repeatedSend(ctx, in)
		if err != nil {
			return workflows.ChargeResult{}, classify(err)
		}
		if repeat && in.Capability == workflows.CapabilityNone {
			return workflows.ChargeResult{}, temporal.NewNonRetryableApplicationError(
				"an earlier attempt of this charge may have reached the provider, which cannot be asked",
				workflows.ErrTypeAmbiguous, nil)
		}
		if repeat {
			res, err := a.InquireCharge(ctx, in.OperationID)
			if !hasType(err, workflows.ErrTypeNotFound) {
				return res, err // the earlier attempt's charge, or no answer yet: never re-send
			}
			if in.Send > 0 {
				return workflows.ChargeResult{}, temporal.NewNonRetryableApplicationError(
					"an earlier attempt of this charge is not booked yet, and may still be", workflows.ErrTypeAmbiguous, nil)
			}
		}
	}
	ch, err := a.Provider.Charge(ctx, in.OperationID.String(), provider.ChargeRequest{
		Reference: in.OperationID.String(), AmountMinor: in.AmountMinor, Currency: in.Currency, AccountID: in.AccountID.String(),
	})
	if err != nil {
		return workflows.ChargeResult{}, classify(err)
	}
	if ch.Status == provider.StatusDeclined {
		return workflows.ChargeResult{}, temporal.NewNonRetryableApplicationError("charge declined", workflows.ErrTypeDeclined, nil, ch.ID)
	}
	return workflows.ChargeResult{ProviderReference: ch.ID, Succeeded: true}, nil
}

// repeatedSend records the send about to go out, and reports whether it went out before.
func (a *Activities) repeatedSend(ctx context.Context, in workflows.ChargeInput) (bool, error) {
	if in.Send > 0 {
		first, err := a.Store.BeginChargeSend(ctx, in.OperationID, in.Send)
		return !first, err
	}
	attempt, err := a.Store.BeginChargeAttempt(ctx, in.OperationID)
	return attempt > 1, err
}

// InquireCharge asks the provider whether a charge exists for the operation.
func (a *Activities) InquireCharge(ctx context.Context, operationID uuid.UUID) (workflows.ChargeResult, error) {
	ch, err := a.Provider.Inquire(ctx, operationID.String())
	if err != nil {
		return workflows.ChargeResult{}, classify(err)
	}
	return workflows.ChargeResult{ProviderReference: ch.ID, Succeeded: ch.Succeeded()}, nil
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
	return classify(err)
}

// FlagStuck marks the payment as needing an operator (an empty reason clears the mark).
func (a *Activities) FlagStuck(ctx context.Context, in workflows.FlagInput) error {
	return classify(a.Store.FlagStuck(ctx, in.OperationID, in.Reason))
}

// classify turns errors into application errors with stable types; anything unrecognised stays
// retryable (a database outage must delay a payment, never fail it).
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
	case errors.Is(err, payment.ErrInconsistent):
		return temporal.NewNonRetryableApplicationError(err.Error(), workflows.ErrTypeInconsistent, err)
	}
	return err
}
