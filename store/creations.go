package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// Account and merchant creations under an operator's Idempotency-Key (store/queries/creations.sql).
// The key's row is written first in the creation's transaction: a concurrent request with the
// same key waits there for the first to end, and then answers what it created.

// CreateAccountOnce is CreateAccount under the merchant's idempotency key: a later request with
// the key and the same currency answers the first account and replayed=true; with another
// currency, payment.ErrIdempotencyReused. Keys are the merchant's own, as a deposit's are its
// account's: another merchant's same key is another creation.
func (s *Store) CreateAccountOnce(ctx context.Context, key string, merchantID uuid.UUID, currency string) (a payment.Account, replayed bool, err error) {
	a = payment.Account{ID: payment.NewID(), MerchantID: merchantID, Kind: "customer", Currency: currency}
	err = s.tx(ctx, func(tx pgx.Tx) error {
		q := s.q.WithTx(tx)
		n, err := q.InsertAccountCreation(ctx, dbsqlc.InsertAccountCreationParams{MerchantID: merchantID, IdempotencyKey: key, AccountID: a.ID})
		if err != nil {
			return err
		}
		if n == 0 {
			return errReplay
		}
		if _, err := tx.Exec(ctx, dbsqlc.InsertAccount, a.ID, merchantID, a.Kind, currency); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, dbsqlc.EnsureSettlementAccount, payment.NewID(), merchantID, currency)
		return err
	})
	if !errors.Is(err, errReplay) {
		return a, false, err
	}
	id, err := s.q.AccountCreation(ctx, dbsqlc.AccountCreationParams{MerchantID: merchantID, IdempotencyKey: key})
	if err != nil {
		return a, false, translate(err)
	}
	first, err := s.Account(ctx, id)
	if err != nil {
		return a, false, err
	}
	if first.Currency != currency {
		return a, false, payment.ErrIdempotencyReused
	}
	return first, true, nil
}

// MerchantCreated is what a merchant's creation answered: its id, its first API key and its
// webhook secret.
type MerchantCreated struct {
	MerchantID, APIKeyID  uuid.UUID
	APIKey, WebhookSecret string
}

// CreateMerchantOnce is CreateMerchantWithKey under an idempotency key. The answer's secrets are
// kept sealed next to the key until the idempotency retention wipes them (ForgetCreationAnswers):
// a later request with the key and the same request hash answers the first creation and
// replayed=true, or, once its secrets are wiped, *payment.AnswerExpiredError; with another
// request hash, payment.ErrIdempotencyReused.
func (s *Store) CreateMerchantOnce(ctx context.Context, key string, requestHash []byte, m payment.Merchant, c MerchantCreated) (MerchantCreated, bool, error) {
	c.MerchantID = m.ID
	create := func(tx pgx.Tx) error {
		q := s.q.WithTx(tx)
		answer, byPrevious, err := s.sealAnswer(ctx, tx, c.APIKey+"\n"+c.WebhookSecret)
		if err != nil {
			return err
		}
		n, err := q.InsertMerchantCreation(ctx, dbsqlc.InsertMerchantCreationParams{IdempotencyKey: key, MerchantID: m.ID,
			ApiKeyID: c.APIKeyID, RequestHash: requestHash, AnswerEnc: answer})
		if err != nil {
			return err
		}
		if n == 0 {
			return errReplay
		}
		if _, err := tx.Exec(ctx, dbsqlc.InsertMerchant, m.ID, m.Name, m.WebhookURL, s.seal(c.WebhookSecret)); err != nil {
			return err
		}
		if _, err := q.InsertAPIKey(ctx, dbsqlc.InsertAPIKeyParams{ID: c.APIKeyID, MerchantID: m.ID, KeyHash: payment.HashAPIKey(c.APIKey)}); err != nil {
			return err
		}
		if err := s.sealingAllowed(ctx, tx); err != nil {
			return err
		}
		return s.answerSealedUnderRecorded(ctx, tx, byPrevious)
	}
	err := s.tx(ctx, create)
	if errors.Is(err, errRotatedMeanwhile) { // sealed again, now under the new key
		err = s.tx(ctx, create)
	}
	if !errors.Is(err, errReplay) {
		return c, false, err
	}
	row, err := s.q.MerchantCreation(ctx, key)
	if err != nil {
		return c, false, translate(err)
	}
	if !bytes.Equal(row.RequestHash, requestHash) {
		return c, false, payment.ErrIdempotencyReused
	}
	if row.AnswerEnc == nil {
		return c, false, &payment.AnswerExpiredError{MerchantID: row.MerchantID.String()}
	}
	answer, err := s.open(row.AnswerEnc)
	if err != nil {
		return c, false, fmt.Errorf("%w: merchant %s: creation answer: %v", ErrInconsistent, row.MerchantID, err)
	}
	first := MerchantCreated{MerchantID: row.MerchantID, APIKeyID: row.ApiKeyID}
	first.APIKey, first.WebhookSecret, _ = strings.Cut(answer, "\n")
	return first, true, nil
}
