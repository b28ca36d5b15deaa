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

// ErrSecretKeyRetired: this process's KASA_SECRET_KEY was replaced by a rotation.
var ErrSecretKeyRetired = fmt.Errorf("%w: KASA_SECRET_KEY was retired by a rotation (kasa rotate-secret-key); use the new key", ErrSecretKeyMismatch)

// CheckSecretKey compares this store's secret key with the deployment's: the first process to
// ask records a check value made from its key (an HMAC, from which the key cannot be learned).
func (s *Store) CheckSecretKey(ctx context.Context) error {
	var recorded []byte
	var retired [][]byte
	err := s.pool.QueryRow(ctx, dbsqlc.SecretKeyCheck, s.keyCheck).Scan(&recorded, &retired)
	if errors.Is(err, pgx.ErrNoRows) { // a process starting at the same time recorded it first
		var st dbsqlc.SecretKeyStateRow
		st, err = s.q.SecretKeyState(ctx)
		recorded, retired = st.CheckValue, st.Retired
	}
	if err != nil {
		return translate(err)
	}
	return s.acceptKey(recorded, retired)
}

// acceptKey says whether this store's keys may seal and open under the deployment's recorded
// key: its own key is that key, or (a rotation under way) its previous one is, and its own was
// never retired.
func (s *Store) acceptKey(recorded []byte, retired [][]byte) error {
	for _, r := range retired {
		if hmac.Equal(r, s.keyCheck) {
			return ErrSecretKeyRetired
		}
	}
	if !hmac.Equal(recorded, s.keyCheck) && (s.prevCheck == nil || !hmac.Equal(recorded, s.prevCheck)) {
		return ErrSecretKeyMismatch
	}
	return nil
}

// sealingAllowed is checked in a transaction that has just written a sealed secret, after the
// write: a rotation that committed meanwhile (it holds writes to merchants until it does) may
// have retired this process's key, and the secret must then not be kept.
func (s *Store) sealingAllowed(ctx context.Context, tx pgx.Tx) error {
	st, err := s.q.WithTx(tx).SecretKeyState(ctx)
	if errors.Is(err, pgx.ErrNoRows) { // no process recorded a key yet (tests that skip the check)
		return nil
	}
	if err != nil {
		return err
	}
	return s.acceptKey(st.CheckValue, st.Retired)
}

// sealAnswer seals what a merchant creation answered, for its replays: any API may be asked
// for one, and during a rotation's first step those not yet restarted hold only the key the
// deployment recorded. So while that key is this process's previous one, the answer is sealed
// with it (byPrevious), for every API to open, until kasa rotate-secret-key re-seals it.
func (s *Store) sealAnswer(ctx context.Context, tx pgx.Tx, answer string) (sealed []byte, byPrevious bool, err error) {
	if s.prevAEAD == nil {
		return s.seal(answer), false, nil
	}
	st, err := s.q.WithTx(tx).SecretKeyState(ctx)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, false, err
	}
	if err != nil || !hmac.Equal(st.CheckValue, s.prevCheck) {
		return s.seal(answer), false, nil
	}
	return sealWith(s.prevAEAD, answer), true, nil
}

// errRotatedMeanwhile: an answer was sealed with the previous key, and a rotation that committed
// meanwhile retired it without re-sealing the answer, which it did not see yet.
var errRotatedMeanwhile = errors.New("KASA_SECRET_KEY was rotated while a merchant was created")

// answerSealedUnderRecorded is checked, like sealingAllowed, after the answer was written: one
// sealed with the previous key is kept only while that key is still the deployment's, so that
// the rotation that retires it is sure to see the answer and re-seal it.
func (s *Store) answerSealedUnderRecorded(ctx context.Context, tx pgx.Tx, byPrevious bool) error {
	if !byPrevious {
		return nil
	}
	st, err := s.q.WithTx(tx).SecretKeyState(ctx)
	if err != nil {
		return err
	}
	if !hmac.Equal(st.CheckValue, s.prevCheck) {
		return errRotatedMeanwhile
	}
	return nil
}

// RotateSecretKey is a master key rotation's last step: it re-seals every merchant's webhook
// secrets, and the answers merchant creations keep for their replays, under this store's key,
// opening them with it or the previous one, and records this key's check value, all in one
// transaction: a secret neither key opens changes nothing. It returns how many merchants it
// re-sealed.
func (s *Store) RotateSecretKey(ctx context.Context) (int, error) {
	if err := s.CheckSecretKey(ctx); err != nil {
		return 0, err
	}
	n := 0
	err := s.tx(ctx, func(tx pgx.Tx) error {
		q := s.q.WithTx(tx)
		st, err := q.LockSecretKeyForRotation(ctx)
		if err != nil {
			return err
		}
		if err := s.acceptKey(st.CheckValue, st.Retired); err != nil {
			return err
		}
		if hmac.Equal(st.CheckValue, s.keyCheck) {
			return errors.New("KASA_SECRET_KEY is the deployment's key already: nothing to rotate")
		}
		if err := q.LockMerchantsForRotation(ctx); err != nil {
			return err
		}
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
		answers, err := q.SealedCreationAnswers(ctx)
		if err != nil {
			return err
		}
		for _, a := range answers {
			answer, err := s.open(a.AnswerEnc)
			if err != nil {
				return fmt.Errorf("merchant creation %q: %w", a.IdempotencyKey, err)
			}
			if err := q.ResealCreationAnswer(ctx, dbsqlc.ResealCreationAnswerParams{IdempotencyKey: a.IdempotencyKey, AnswerEnc: s.seal(answer)}); err != nil {
				return err
			}
		}
		return q.RetireSecretKey(ctx, s.keyCheck)
	})
	return n, err
}

// keyCheckValue is the check value of key.
func keyCheckValue(key []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("kasa secret key check v1"))
	return m.Sum(nil)
}
