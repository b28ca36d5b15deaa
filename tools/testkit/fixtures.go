package testkit

import (
	"cmp"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// Merchant is a merchant made through the store, with one TRY account.
type Merchant struct {
	ID, Account   uuid.UUID
	WebhookSecret string
}

// MerchantOptions describe the merchant NewMerchant makes; the zero value is a merchant named
// "m", without a webhook URL, with a random webhook secret and an empty account.
type MerchantOptions struct {
	Name          string
	WebhookURL    string
	WebhookSecret string
	Deposit       int64 // minor units paid into the account
}

// NewMerchant makes a merchant with one TRY account, funded with o.Deposit.
func NewMerchant(t testing.TB, db *store.Store, o MerchantOptions) Merchant {
	t.Helper()
	o.Name = cmp.Or(o.Name, "m")
	o.WebhookSecret = cmp.Or(o.WebhookSecret, payment.NewSecret("whsec_"))
	ctx := context.Background()
	m := Merchant{ID: payment.NewID(), WebhookSecret: o.WebhookSecret}
	require.NoError(t, db.CreateMerchant(ctx, payment.Merchant{ID: m.ID, Name: o.Name, WebhookURL: o.WebhookURL}, payment.NewSecret("sk_"), m.WebhookSecret))
	a, err := db.CreateAccount(ctx, m.ID, "TRY")
	require.NoError(t, err)
	if o.Deposit > 0 {
		_, _, err = db.Deposit(ctx, a.ID, "seed", o.Deposit)
		require.NoError(t, err)
	}
	m.Account = a.ID
	return m
}

// Settle runs a new payment of 1.00 TRY through the store's steps to succeeded, through unknown
// first when viaUnknown: one outbox event per status change. It returns no error only when every
// step ran; safe to call from many goroutines.
func Settle(ctx context.Context, db *store.Store, m Merchant, viaUnknown bool) (uuid.UUID, error) {
	key := uuid.NewString()
	req := payment.Request{InvoiceID: key, AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
	_, p, began, err := db.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	if err != nil {
		return uuid.Nil, err
	}
	if began != store.BeganNew {
		return uuid.Nil, fmt.Errorf("payment %s: a new key did not begin a new payment (%v)", key, began)
	}
	if err := db.Reserve(ctx, p.ID); err != nil {
		return uuid.Nil, err
	}
	if viaUnknown {
		if _, err := db.MarkUnknown(ctx, p.ID); err != nil {
			return uuid.Nil, err
		}
	}
	_, err = db.Finalize(ctx, p.ID, "ch_"+key)
	return p.ID, err
}
