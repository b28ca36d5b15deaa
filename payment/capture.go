package payment

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// Refusals of a capture or a cancel: nothing is changed by them (docs/api.md, "Authorize now,
// capture later").
var (
	ErrNotCapturable = errors.New("the payment is not waiting for a capture")
	ErrNotCancelable = errors.New("the payment is not waiting for a capture, so there is nothing to cancel")
)

// CaptureExceedsError is a capture of more than the authorization holds.
type CaptureExceedsError struct {
	Capturable int64
	Currency   string
}

func (e *CaptureExceedsError) Error() string {
	return fmt.Sprintf("capture exceeds the capturable amount (%s %s)", e.CapturableAmount(), e.Currency)
}

// CapturableAmount is Capturable as a decimal string.
func (e *CaptureExceedsError) CapturableAmount() string {
	return FormatAmount(e.Capturable, e.Currency)
}

// Command is what a merchant asks of an authorized payment: a capture or a cancel.
type Command string

const (
	CommandCapture Command = "capture"
	CommandCancel  Command = "cancel"
)

// CommandRequest is a validated capture or cancel request. Amount is a capture's normalised
// decimal, "" for all that is capturable (and for a cancel, which takes none).
type CommandRequest struct {
	Kind   Command
	Amount string
	digits int // the fraction digits the body gave
}

// ParseCommandRequest decodes a capture's body ({"amount"?}) or a cancel's ({}, or none) as
// strictly as ParseRequest.
func ParseCommandRequest(kind Command, body []byte) (CommandRequest, error) {
	req := CommandRequest{Kind: kind}
	if len(body) == 0 {
		return req, nil
	}
	fields, err := decodeObject(body)
	if err != nil {
		return req, &ValidationError{Fields: []FieldError{{"body", err.Error()}}}
	}
	var ve ValidationError
	for _, k := range fields.order {
		if k != "amount" || kind != CommandCapture {
			ve.add(k, "unknown field")
		}
	}
	if raw, ok := fields.get("amount"); ok && kind == CommandCapture && string(raw) != "null" {
		if s, err := stringOrNumber(raw); err != nil {
			ve.add("amount", "must be a decimal string or a JSON number")
		} else if req.Amount, req.digits, err = normalizeDecimal(s); err != nil {
			ve.add("amount", err.Error())
		}
	}
	if len(ve.Fields) > 0 {
		return CommandRequest{}, &ve
	}
	return req, nil
}

// AmountMinor is the capture's amount in the currency's minor units, 0 for all that is
// capturable. Too many fraction digits for the currency is a *ValidationError.
func (r CommandRequest) AmountMinor(currency string) (int64, error) {
	return requestAmountMinor(r.Amount, r.digits, currency)
}

// Hash is the SHA-256 of the canonical form with the payment's id, length-prefixed as the
// refund's: a key names one command on one payment.
func (r CommandRequest) Hash(paymentID uuid.UUID) string {
	h := sha256.New()
	amount := "-"
	if r.Amount != "" {
		amount = r.Amount
	}
	for _, f := range []string{string(r.Kind), paymentID.String(), amount} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return hex.EncodeToString(h.Sum(nil))
}
