package payment

import (
	"time"

	"github.com/google/uuid"
)

// Refund gives back all or part of a succeeded payment; its ID is the refund's operation id
// (UUIDv7). AccountID is the payer's account, which the refund credits.
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
}
