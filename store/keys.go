package store

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// Merchants' API keys (store/queries/keys.sql). Only a key's SHA-256 is stored.

// APIKey is one of a merchant's API keys, without the key itself.
type APIKey struct {
	ID        uuid.UUID
	CreatedAt time.Time
	RevokedAt *time.Time // nil while the key is valid
}

// CreateMerchant stores a merchant with its first API key (hashed) and its webhook secret
// (encrypted).
func (s *Store) CreateMerchant(ctx context.Context, m payment.Merchant, apiKey, webhookSecret string) error {
	return s.CreateMerchantWithKey(ctx, m, payment.NewID(), apiKey, webhookSecret)
}

// CreateMerchantWithKey is CreateMerchant with the first key's id chosen by the caller.
func (s *Store) CreateMerchantWithKey(ctx context.Context, m payment.Merchant, keyID uuid.UUID, apiKey, webhookSecret string) error {
	return s.tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, dbsqlc.InsertMerchant, m.ID, m.Name, m.WebhookURL, s.seal(webhookSecret)); err != nil {
			return err
		}
		if _, err := dbsqlc.New(tx).InsertAPIKey(ctx, dbsqlc.InsertAPIKeyParams{ID: keyID, MerchantID: m.ID, KeyHash: payment.HashAPIKey(apiKey)}); err != nil {
			return err
		}
		return s.sealingAllowed(ctx, tx)
	})
}

// AddAPIKey gives a merchant one more valid key; its other keys keep working.
// payment.ErrNotFound when there is no such merchant.
func (s *Store) AddAPIKey(ctx context.Context, merchantID, keyID uuid.UUID, apiKey string) error {
	n, err := s.q.InsertAPIKey(ctx, dbsqlc.InsertAPIKeyParams{ID: keyID, MerchantID: merchantID, KeyHash: payment.HashAPIKey(apiKey)})
	if err != nil {
		return translate(err)
	}
	if n == 0 {
		return payment.ErrNotFound
	}
	return nil
}

// RevokeAPIKey makes a merchant's key invalid from the next lookup on; revoking a revoked key
// changes nothing. payment.ErrNotFound when the merchant has no such key.
func (s *Store) RevokeAPIKey(ctx context.Context, merchantID, keyID uuid.UUID) error {
	n, err := s.q.RevokeAPIKey(ctx, dbsqlc.RevokeAPIKeyParams{ID: keyID, MerchantID: merchantID})
	if err != nil {
		return translate(err)
	}
	if n == 0 {
		return payment.ErrNotFound
	}
	return nil
}

// APIKeys lists a merchant's keys, oldest first, revoked ones included.
// payment.ErrNotFound when there is no such merchant.
func (s *Store) APIKeys(ctx context.Context, merchantID uuid.UUID) ([]APIKey, error) {
	exists, err := s.q.MerchantExists(ctx, merchantID)
	if err != nil {
		return nil, translate(err)
	}
	if !exists {
		return nil, payment.ErrNotFound
	}
	rows, err := s.q.APIKeysOf(ctx, merchantID)
	if err != nil {
		return nil, translate(err)
	}
	keys := make([]APIKey, len(rows))
	for i, r := range rows {
		keys[i] = APIKey{ID: r.ID, CreatedAt: r.CreatedAt, RevokedAt: r.RevokedAt}
	}
	return keys, nil
}

// RotateWebhookSecret replaces a merchant's webhook secret; the replaced one keeps signing next
// to it for overlap (an older previous secret is dropped), or, with no overlap, is wiped at once.
// It returns until when both sign: with no overlap, the database's now.
// payment.ErrNotFound when there is no such merchant.
func (s *Store) RotateWebhookSecret(ctx context.Context, merchantID uuid.UUID, secret string, overlap time.Duration) (time.Time, error) {
	var until time.Time
	err := s.tx(ctx, func(tx pgx.Tx) (err error) {
		until, err = s.q.WithTx(tx).RotateWebhookSecret(ctx, dbsqlc.RotateWebhookSecretParams{
			ID: merchantID, WebhookSecretEnc: s.seal(secret), OverlapSeconds: overlap.Seconds(),
		})
		if err != nil {
			return err
		}
		return s.sealingAllowed(ctx, tx)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, payment.ErrNotFound
	}
	if err != nil {
		return time.Time{}, translate(err)
	}
	return until, nil
}
