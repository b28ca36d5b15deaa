package store

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// ErrSecretKeyMismatch: this process's KASA_SECRET_KEY is not the one the deployment's other
// processes use, so it could neither open the webhook secrets they sealed nor seal ones they can
// open.
var ErrSecretKeyMismatch = errors.New("KASA_SECRET_KEY differs from the key the rest of this deployment uses: " +
	"give every api, worker and relay the same KASA_SECRET_KEY")

// CheckSecretKey compares this store's secret key with the deployment's: the first process to
// ask records a check value made from its key (an HMAC, from which the key cannot be learned).
func (s *Store) CheckSecretKey(ctx context.Context) error {
	var recorded []byte
	err := s.pool.QueryRow(ctx, dbsqlc.SecretKeyCheck, s.keyCheck).Scan(&recorded)
	if errors.Is(err, pgx.ErrNoRows) { // a process starting at the same time recorded it first
		err = s.pool.QueryRow(ctx, dbsqlc.GetSecretKeyCheck).Scan(&recorded)
	}
	if err != nil {
		return translate(err)
	}
	if !hmac.Equal(recorded, s.keyCheck) && (s.prevCheck == nil || !hmac.Equal(recorded, s.prevCheck)) {
		return ErrSecretKeyMismatch
	}
	return nil
}

// RotateSecretKey is a master key rotation's last step: it re-seals every merchant's webhook
// secrets under this store's key, opening them with it or the previous one, and records this
// key's check value, all in one transaction: a secret neither key opens changes nothing. It
// returns how many merchants it re-sealed.
func (s *Store) RotateSecretKey(ctx context.Context) (int, error) {
	if err := s.CheckSecretKey(ctx); err != nil {
		return 0, err
	}
	n := 0
	err := s.tx(ctx, func(tx pgx.Tx) error {
		q := s.q.WithTx(tx)
		rows, err := q.SealedWebhookSecrets(ctx)
		if err != nil {
			return err
		}
		for _, r := range rows {
			p := dbsqlc.ResealWebhookSecretsParams{ID: r.ID}
			secret, err := s.open(r.WebhookSecretEnc)
			if err != nil {
				return fmt.Errorf("merchant %s: %w", r.ID, err)
			}
			p.WebhookSecretEnc = s.seal(secret)
			if r.WebhookSecretPrevEnc != nil {
				prev, err := s.open(r.WebhookSecretPrevEnc)
				if err != nil {
					return fmt.Errorf("merchant %s: previous webhook secret: %w", r.ID, err)
				}
				p.WebhookSecretPrevEnc = s.seal(prev)
			}
			if err := q.ResealWebhookSecrets(ctx, p); err != nil {
				return err
			}
			n++
		}
		return q.SetSecretKeyCheck(ctx, s.keyCheck)
	})
	return n, err
}

// keyCheckValue is the check value of key.
func keyCheckValue(key []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("kasa secret key check v1"))
	return m.Sum(nil)
}
