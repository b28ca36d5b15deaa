package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// MerchantByAPIKey authenticates a merchant; unknown keys are payment.ErrUnauthorized.
func (s *Store) MerchantByAPIKey(ctx context.Context, apiKey string) (payment.Merchant, error) {
	var m payment.Merchant
	err := s.pool.QueryRow(ctx, dbsqlc.MerchantByAPIKey, payment.HashAPIKey(apiKey)).Scan(&m.ID, &m.Name, &m.WebhookURL)
	if errors.Is(err, pgx.ErrNoRows) {
		return m, payment.ErrUnauthorized
	}
	return m, translate(err)
}

// CreateAccount opens a customer (payer) account for a merchant, and the merchant's settlement
// account in that currency if it has none yet.
func (s *Store) CreateAccount(ctx context.Context, merchantID uuid.UUID, currency string) (payment.Account, error) {
	a := payment.Account{ID: payment.NewID(), MerchantID: merchantID, Kind: "customer", Currency: currency}
	err := s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, dbsqlc.InsertAccount, a.ID, merchantID, a.Kind, currency); err != nil {
			return err // payment.ErrNotFound for no such merchant, once s.tx translates it
		}
		_, err := tx.Exec(ctx, dbsqlc.EnsureSettlementAccount, payment.NewID(), merchantID, currency)
		return err
	})
	return a, err
}

// Account reads one account.
func (s *Store) Account(ctx context.Context, id uuid.UUID) (payment.Account, error) {
	return scanAccount(s.pool.QueryRow(ctx, dbsqlc.GetAccount, id))
}

func scanAccount(row pgx.Row) (payment.Account, error) {
	var a payment.Account
	err := row.Scan(&a.ID, &a.MerchantID, &a.Kind, &a.Currency, &a.Balance, &a.Reserved)
	return a, translate(err)
}

// Deposit is money entering a customer account from outside.
type Deposit struct {
	ID          uuid.UUID
	AccountID   uuid.UUID
	AmountMinor int64
	Currency    string
	CreatedAt   time.Time
}

// Deposit credits an account once per (account, idempotency key) with a balanced posting against
// the currency's external account. A replay returns the first deposit and replayed=true; the
// same key with another amount is payment.ErrIdempotencyReused.
func (s *Store) Deposit(ctx context.Context, accountID uuid.UUID, key string, amount int64) (d Deposit, replayed bool, err error) {
	acct, err := s.Account(ctx, accountID)
	if err != nil {
		return d, false, err
	}
	if acct.Kind != "customer" {
		return d, false, payment.ErrNotFound
	}
	d = Deposit{ID: payment.NewID(), AccountID: accountID, AmountMinor: amount, Currency: acct.Currency}
	inserted := false
	err = s.tx(ctx, func(tx pgx.Tx) error {
		postingID := payment.NewID()
		if err := insertPosting(ctx, tx, postingID, "deposit", d.ID.String()); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, dbsqlc.InsertDeposit, d.ID, accountID, key, amount, postingID).Scan(&d.CreatedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return errReplay // roll back the posting; the key was used before
		}
		if err != nil {
			return err
		}
		inserted = true
		if _, err := tx.Exec(ctx, dbsqlc.EnsureExternalAccount, payment.NewID(), acct.Currency); err != nil {
			return err
		}
		var external uuid.UUID
		if err := tx.QueryRow(ctx, dbsqlc.ExternalAccount, acct.Currency).Scan(&external); err != nil {
			return err
		}
		return postPair(ctx, tx, postingID, acct.Currency, accountID, external, amount)
	})
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && (pgErr.Code == "22003" || pgErr.ConstraintName == "accounts_currency_bound") {
		return d, false, &payment.ValidationError{Fields: []payment.FieldError{{Field: "amount",
			Message: "would take a balance past the largest amount kasa holds"}}}
	}
	if inserted || !errors.Is(err, errReplay) {
		return d, false, err
	}
	var first Deposit
	first.AccountID, first.Currency = accountID, acct.Currency
	if err := s.pool.QueryRow(ctx, dbsqlc.GetDeposit, accountID, key).Scan(&first.ID, &first.AmountMinor, &first.CreatedAt); err != nil {
		return d, false, translate(err)
	}
	if first.AmountMinor != amount {
		return first, false, payment.ErrIdempotencyReused
	}
	return first, true, nil
}

var errReplay = errors.New("replay")
