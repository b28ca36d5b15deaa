package store

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"

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
	if !hmac.Equal(recorded, s.keyCheck) {
		return ErrSecretKeyMismatch
	}
	return nil
}

// keyCheckValue is the check value of key.
func keyCheckValue(key []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("kasa secret key check v1"))
	return m.Sum(nil)
}
