// Package store is kasa's only PostgreSQL user: every query, transaction and error translation.
package store

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/kasa-pay/kasa/schema"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// Store wraps a connection pool.
type Store struct {
	pool      *pgxpool.Pool
	aead      cipher.AEAD     // encrypts merchants' webhook secrets at rest
	outcomes  outcomes        // committed outcomes, announced in process (WatchOutcome)
	q         *dbsqlc.Queries // sqlc's methods for the statements of store/queries
	keyCheck  []byte          // the secret key's check value (CheckSecretKey)
	prevAEAD  cipher.AEAD     // the previous secret key's, during a rotation; nil otherwise
	prevCheck []byte          // its check value
}

// Options configure Open.
type Options struct {
	URL       string
	MaxConns  int32
	SecretKey []byte // 32 bytes; encrypts webhook secrets
	// PreviousSecretKey, during a rotation of SecretKey, opens what it sealed; it seals nothing.
	PreviousSecretKey []byte
	Migrate           bool // apply pending migrations first
	// MigrateLockWait, with Migrate, bounds how long a migration is tried again while another
	// transaction holds a lock it needs (0: schema.DefaultLockWait).
	MigrateLockWait time.Duration
	// AppRole, with Migrate, is granted exactly the application's privileges after the
	// migrations (schema/grants.sql); URL must then be the tables' owner's.
	AppRole string
	// AppName names the process's sessions (application_name, seen in pg_stat_activity) unless
	// the URL names them.
	AppName string
}

// Open connects, optionally migrates, and checks the connection.
func Open(ctx context.Context, o Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(o.URL)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok && o.AppName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = o.AppName
	}
	cfg.AfterConnect = registerUUID
	aead, err := newAEAD(o.SecretKey)
	if err != nil {
		return nil, err
	}
	var prev cipher.AEAD
	if o.PreviousSecretKey != nil {
		if prev, err = newAEAD(o.PreviousSecretKey); err != nil {
			return nil, fmt.Errorf("previous %w", err)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	s := &Store{pool: pool, aead: aead, prevAEAD: prev, q: dbsqlc.New(pool), keyCheck: keyCheckValue(o.SecretKey)}
	if prev != nil {
		s.prevCheck = keyCheckValue(o.PreviousSecretKey)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w: database: %v", ErrUnavailable, err)
	}
	if o.Migrate {
		db := stdlib.OpenDBFromPool(pool)
		err := schema.Migrate(ctx, db, schema.Options{LockWait: o.MigrateLockWait})
		if err == nil && o.AppRole != "" {
			err = schema.Grant(ctx, db, o.AppRole)
		}
		db.Close()
		if err != nil {
			pool.Close()
			return nil, err
		}
	}
	return s, nil
}

// Close releases every connection.
func (s *Store) Close() { s.pool.Close() }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return nil
}

// tx runs fn in a transaction, committing when it returns nil.
func (s *Store) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	err := pgx.BeginFunc(ctx, s.pool, fn)
	return translate(err)
}

func (s *Store) seal(plain string) []byte { return sealWith(s.aead, plain) }

func sealWith(aead cipher.AEAD, plain string) []byte {
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	return aead.Seal(nonce, nonce, []byte(plain), nil)
}

// open opens what seal sealed, with this store's key or, during a rotation, the previous one.
func (s *Store) open(sealed []byte) (string, error) {
	plain, err := openWith(s.aead, sealed)
	if err != nil && s.prevAEAD != nil {
		plain, err = openWith(s.prevAEAD, sealed)
	}
	if err != nil {
		return "", fmt.Errorf("decrypt webhook secret (wrong KASA_SECRET_KEY?): %w", err)
	}
	return plain, nil
}

func openWith(aead cipher.AEAD, sealed []byte) (string, error) {
	n := aead.NonceSize()
	if len(sealed) < n {
		return "", errors.New("sealed secret too short")
	}
	plain, err := aead.Open(nil, sealed[:n], sealed[n:], nil)
	return string(plain), err
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	if len(key) != 32 {
		return nil, errors.New("secret key must be 32 bytes")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
