package payment

import (
	"errors"
	"strings"
)

// Domain errors. The api package maps each to one HTTP answer; nothing else does.
var (
	ErrInvalidAmount     = errors.New("amount must be a decimal number")
	ErrNonPositiveAmount = errors.New("amount must be greater than zero")
	ErrTooManyDecimals   = errors.New("amount has more fraction digits than the currency allows")
	ErrAmountTooLarge    = errors.New("amount is too large")
	ErrUnknownCurrency   = errors.New("currency is not a known ISO 4217 code")

	ErrNotFound            = errors.New("not found")
	ErrInsufficientFunds   = errors.New("insufficient funds")
	ErrCurrencyMismatch    = errors.New("currency differs from the account's currency")
	ErrIdempotencyKeyInUse = errors.New("a request with this idempotency key is still being processed")
	ErrIdempotencyReused   = errors.New("idempotency key was used with a different request")
	ErrKeyMissing          = errors.New("idempotency-key header is required")
	ErrKeyInvalid          = errors.New("idempotency-key must be 1-255 printable ASCII characters without spaces")
	ErrUnauthorized        = errors.New("missing or invalid credentials")
	ErrUnavailable         = errors.New("a dependency is unavailable")
	ErrInconsistent        = errors.New("inconsistent state: the data contradicts the requested step")
)

// DecidedError: a run's first step found its operation already decided by another run.
// RunOfRecord is the run that took the operation on ("" when none is recorded).
type DecidedError struct {
	ID          string
	Status      Status
	RunOfRecord string
}

func (e *DecidedError) Error() string {
	return "operation " + e.ID + " is already " + string(e.Status) + ": another run does not take it on again"
}

// FieldError names one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// ValidationError is a request that cannot be executed as sent.
type ValidationError struct {
	Fields []FieldError
	cause  error // the domain error behind a single field's problem, if any
}

// Unwrap lets errors.Is find the domain error behind the problem (ErrTooManyDecimals...).
func (e *ValidationError) Unwrap() error { return e.cause }

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + ": " + f.Message
	}
	return "invalid request: " + strings.Join(parts, "; ")
}

func (e *ValidationError) add(field, msg string) { e.Fields = append(e.Fields, FieldError{field, msg}) }

// DuplicatePaymentError is a business-key conflict: the invoice already has a live payment.
type DuplicatePaymentError struct {
	PaymentID string
}

func (e *DuplicatePaymentError) Error() string {
	return "invoice already has a payment that is processing, unknown or succeeded: " + e.PaymentID
}

// AnswerExpiredError: a merchant's creation is retried with its idempotency key after the
// retention wiped the answer's secrets (kept only that long). The key still names the merchant.
type AnswerExpiredError struct{ MerchantID string }

func (e *AnswerExpiredError) Error() string {
	return "merchant " + e.MerchantID + " was created with this idempotency key, and its secrets are no longer kept: " +
		"make new ones (POST /admin/v1/merchants/" + e.MerchantID + "/api-keys, then revoke the first key; " +
		"POST /admin/v1/merchants/" + e.MerchantID + "/webhook-secret?revoke_previous=true)"
}
