package store

import (
	"context"

	"github.com/google/uuid"
)

// Exec runs one statement; tests use it to prove the schema guards itself.
func (s *Store) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := s.pool.Exec(ctx, sql, args...)
	return translate(err)
}

var MinUUIDv7 = minUUIDv7

// HoldRowLock locks an account row in a transaction of its own until release is called.
func (s *Store) HoldRowLock(ctx context.Context, account uuid.UUID) (release func(), err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, account); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return func() { _ = tx.Rollback(ctx) }, nil
}

// QueryRow runs one query and scans its single row; tests use it to check type handling.
func (s *Store) QueryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	return s.pool.QueryRow(ctx, sql, args...).Scan(dest...)
}
