package payment

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Payment is one business operation; its ID is the operation id (UUIDv7).
type Payment struct {
	ID                uuid.UUID
	MerchantID        uuid.UUID
	IdempotencyKey    string
	AccountID         uuid.UUID
	AmountMinor       int64
	AmountRefunded    int64 // minor units of its succeeded refunds
	Currency          string
	InvoiceID         string
	PaymentType       string
	Status            Status
	FailureCode       string
	ProviderReference string
	CreatedAt         time.Time
	UpdatedAt         time.Time
	// A manual-capture payment is authorized first and captured (CapturedMinor, at most
	// AmountMinor) or canceled later, before CaptureBefore.
	CaptureManual bool
	CaptureBefore time.Time
	CapturedMinor int64
	// CaptureClosed: the payment takes no capture now although it reads requires_capture (a
	// capture or cancel is under way, or its window is over). Set by readers that show it.
	CaptureClosed bool
	// StuckReason says why its workflow waits for an operator ("" when it does not).
	StuckReason string
}

// Capturable is what a capture may still take: the whole authorization while it waits, nothing
// once a command is under way (it takes the authorization) or the window is over.
func (p Payment) Capturable() int64 {
	if p.Status == StatusRequiresCapture && !p.CaptureClosed {
		return p.AmountMinor
	}
	return 0
}

// Refundable is what refunds may give back in all: what was captured.
func (p Payment) Refundable() int64 {
	if p.CaptureManual {
		return p.CapturedMinor
	}
	return p.AmountMinor
}

// Resource is the payment as merchants see it, in the API and in webhook events (docs/api.md).
type Resource struct {
	ID                string  `json:"id"`
	Status            Status  `json:"status"`
	Amount            string  `json:"amount"`
	AmountRefunded    string  `json:"amount_refunded"`
	Currency          string  `json:"currency"`
	InvoiceID         string  `json:"invoice_id"`
	PaymentType       string  `json:"payment_type"`
	AccountID         string  `json:"account_id"`
	FailureCode       *string `json:"failure_code"`
	ProviderReference *string `json:"provider_reference"`
	CreatedAt         string  `json:"created_at"`
	UpdatedAt         string  `json:"updated_at"`
	// Manual-capture payments only.
	Capture        string `json:"capture,omitempty"`
	Capturable     string `json:"capturable,omitempty"`
	AmountCaptured string `json:"amount_captured,omitempty"`
	CaptureBefore  string `json:"capture_before,omitempty"`
}

// CaptureManual is the request's and the resource's `capture` of a manual-capture payment.
const CaptureManual = "manual"

// Resource renders p for merchants. Times are UTC RFC 3339 with microseconds (the database's precision).
func (p Payment) Resource() Resource {
	r := p.resource()
	if p.CaptureManual {
		r.Capture = CaptureManual
		r.Capturable = FormatAmount(p.Capturable(), p.Currency)
		r.AmountCaptured = FormatAmount(p.CapturedMinor, p.Currency)
		r.CaptureBefore = FormatTime(p.CaptureBefore)
	}
	return r
}

func (p Payment) resource() Resource {
	return Resource{
		ID: p.ID.String(), Status: p.Status,
		Amount: FormatAmount(p.AmountMinor, p.Currency), AmountRefunded: FormatAmount(p.AmountRefunded, p.Currency), Currency: p.Currency,
		InvoiceID: p.InvoiceID, PaymentType: p.PaymentType, AccountID: p.AccountID.String(),
		FailureCode: optional(p.FailureCode), ProviderReference: optional(p.ProviderReference),
		CreatedAt: FormatTime(p.CreatedAt), UpdatedAt: FormatTime(p.UpdatedAt),
	}
}

// FormatTime renders t as UTC RFC 3339 with microseconds.
func FormatTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00") }

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// NewID mints a time-ordered UUIDv7 (they keep B-tree inserts at the right edge of the index).
func NewID() uuid.UUID { return uuid.Must(uuid.NewV7()) }

// NewSecret returns a random credential with a readable prefix ("sk_live_...", "whsec_...").
func NewSecret(prefix string) string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return prefix + hex.EncodeToString(b)
}

// HashAPIKey is what the database stores instead of a merchant's API key.
func HashAPIKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// Account is a balance holder. Balance is what kasa owes the holder; available = balance - reserved.
type Account struct {
	ID         uuid.UUID
	MerchantID uuid.UUID
	Kind       string
	Currency   string
	Balance    int64
	Reserved   int64
}

// Merchant is a kasa customer that takes payments.
type Merchant struct {
	ID         uuid.UUID
	Name       string
	WebhookURL string
}

// AnswerBody is a finished payment's stored answer: the resource that the request that created
// it is answered with and that every replay of its idempotency key repeats, byte for byte. It is
// stored in the same transaction that finishes the payment, so it exists exactly when the payment
// is final.
func (p Payment) AnswerBody() ([]byte, error) {
	if !p.Status.Answered() {
		return nil, fmt.Errorf("payment %s is %s: only an answered payment has a stored answer", p.ID, p.Status)
	}
	return JSON(p.Resource())
}

// JSON renders v as the API does: compact, a trailing newline, no HTML escaping.
func JSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
