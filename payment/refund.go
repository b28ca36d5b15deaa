package payment

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
)

// MaxRefundReason is the longest reason a refund may carry, in characters.
const MaxRefundReason = 200

// Refund errors. The api package maps each to one HTTP answer.
var ErrPaymentNotRefundable = errors.New("only a succeeded payment can be refunded")

// RefundExceedsError is a refund of more than is still refundable: the payment's amount less its
// succeeded, in-flight and unknown refunds.
type RefundExceedsError struct {
	Refundable int64 // minor units
	Currency   string
}

func (e *RefundExceedsError) Error() string {
	return fmt.Sprintf("refund exceeds the refundable amount (%s %s)", e.RefundableAmount(), e.Currency)
}

// RefundableAmount renders what is still refundable as the API shows amounts.
func (e *RefundExceedsError) RefundableAmount() string { return FormatAmount(e.Refundable, e.Currency) }

// Refund gives back part or all of a succeeded payment; its ID is the refund's operation id
// (UUIDv7), the provider's idempotency key for it. AccountID is the payer's account, which the
// refund credits.
type Refund struct {
	ID                uuid.UUID
	PaymentID         uuid.UUID
	MerchantID        uuid.UUID
	AccountID         uuid.UUID
	IdempotencyKey    string
	AmountMinor       int64
	Currency          string
	Reason            string
	Status            Status
	FailureCode       string
	ProviderReference string
	CreatedAt         time.Time
	UpdatedAt         time.Time
	StuckReason       string // why its workflow waits for an operator ("" when it does not)
}

// RefundResource is the refund as merchants see it, in the API and in webhook events.
type RefundResource struct {
	ID                string  `json:"id"`
	PaymentID         string  `json:"payment_id"`
	Status            Status  `json:"status"`
	Amount            string  `json:"amount"`
	Currency          string  `json:"currency"`
	Reason            *string `json:"reason"`
	FailureCode       *string `json:"failure_code"`
	ProviderReference *string `json:"provider_reference"`
	CreatedAt         string  `json:"created_at"`
	UpdatedAt         string  `json:"updated_at"`
}

// Resource renders r for merchants.
func (r Refund) Resource() RefundResource {
	return RefundResource{
		ID: r.ID.String(), PaymentID: r.PaymentID.String(), Status: r.Status,
		Amount: FormatAmount(r.AmountMinor, r.Currency), Currency: r.Currency, Reason: optional(r.Reason),
		FailureCode: optional(r.FailureCode), ProviderReference: optional(r.ProviderReference),
		CreatedAt: FormatTime(r.CreatedAt), UpdatedAt: FormatTime(r.UpdatedAt),
	}
}

// AnswerBody is a finished refund's stored answer, as Payment.AnswerBody is a payment's.
func (r Refund) AnswerBody() ([]byte, error) {
	if !r.Status.Final() {
		return nil, fmt.Errorf("refund %s is %s: only a final refund has a stored answer", r.ID, r.Status)
	}
	return JSON(r.Resource())
}

// RefundRequest is a validated refund request in canonical form. Its amount can only be checked
// against the payment's currency, which the body does not name: Amount keeps the decimal
// normalised (no leading zeros, no trailing fraction zeros), "" when the body has none.
type RefundRequest struct {
	Amount string
	Reason string
	digits int // the fraction digits the body gave
}

// AmountMinor is the requested amount in the currency's minor units, 0 when the request names
// none (all that is refundable). Too many fraction digits for the currency is a *ValidationError.
func (r RefundRequest) AmountMinor(currency string) (int64, error) {
	return requestAmountMinor(r.Amount, r.digits, currency)
}

// Hash is the SHA-256 of the canonical form with the refunded payment's id: equivalent requests
// ("30", 30.00) hash equal. The normalised decimal equals another exactly when their minor units
// in the payment's currency do, so the hash needs no currency. Fields are length-prefixed, and
// the amount carries whether it was given.
func (r RefundRequest) Hash(paymentID uuid.UUID) string {
	h := sha256.New()
	amount := "-" // no amount; never a normalised decimal
	if r.Amount != "" {
		amount = r.Amount
	}
	for _, f := range []string{"refund", paymentID.String(), amount, r.Reason} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ParseRefundRequest decodes and validates a POST /v1/payments/{id}/refunds body as strictly as
// ParseRequest: unknown (or differently cased), duplicate fields and trailing data are refused.
// Both fields are optional; null means absent, and so does an empty reason.
func ParseRefundRequest(body []byte) (RefundRequest, error) {
	fields, err := decodeObject(body)
	if err != nil {
		return RefundRequest{}, &ValidationError{Fields: []FieldError{{"body", err.Error()}}}
	}
	var (
		ve  ValidationError
		req RefundRequest
	)
	for _, k := range fields.order {
		if k != "amount" && k != "reason" {
			ve.add(k, "unknown field")
		}
	}
	if raw, ok := fields.get("amount"); ok && string(raw) != "null" {
		if s, err := stringOrNumber(raw); err != nil {
			ve.add("amount", "must be a decimal string or a JSON number")
		} else if req.Amount, req.digits, err = normalizeDecimal(s); err != nil {
			ve.add("amount", err.Error())
		}
	}
	if raw, ok := fields.get("reason"); ok && string(raw) != "null" {
		if s, err := stringValue(raw); err != nil {
			ve.add("reason", "must be a string")
		} else if utf8.RuneCountInString(s) > MaxRefundReason {
			ve.add("reason", fmt.Sprintf("must be at most %d characters", MaxRefundReason))
		} else if strings.IndexFunc(s, unicode.IsControl) >= 0 {
			ve.add("reason", "must not contain control characters")
		} else {
			req.Reason = s
		}
	}
	if len(ve.Fields) > 0 {
		return RefundRequest{}, &ve
	}
	return req, nil
}

// normalizeDecimal checks a positive decimal as ParseAmount does, without a currency, and
// returns it without leading zeros or trailing fraction zeros ("030.50" -> "30.5"), with how
// many fraction digits it had (2): zeros count against the currency, as in a payment's amount.
func normalizeDecimal(s string) (string, int, error) {
	if strings.HasPrefix(s, "-") {
		return "", 0, ErrNonPositiveAmount
	}
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" || (hasDot && frac == "") || !allDigits(intPart) || !allDigits(frac) {
		return "", 0, ErrInvalidAmount
	}
	digits := len(frac)
	intPart, frac = strings.TrimLeft(intPart, "0"), strings.TrimRight(frac, "0")
	if len(intPart) > 18 {
		return "", 0, ErrAmountTooLarge
	}
	if intPart == "" && frac == "" {
		return "", 0, ErrNonPositiveAmount
	}
	if intPart == "" {
		intPart = "0"
	}
	if frac != "" {
		intPart += "." + frac
	}
	return intPart, digits, nil
}

// requestAmountMinor is a refund's or capture's normalised amount of digits fraction digits in
// the currency's minor units, 0 for none. Too many digits for the currency is a *ValidationError.
func requestAmountMinor(amount string, digits int, currency string) (int64, error) {
	if amount == "" {
		return 0, nil
	}
	minor, err := ParseAmount(amount, currency)
	if err == nil && digits > Exponent(currency) {
		err = ErrTooManyDecimals
	}
	if err != nil {
		return 0, &ValidationError{Fields: []FieldError{{"amount", err.Error()}}, cause: err}
	}
	return minor, nil
}
