package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kasa-pay/kasa/schema"
)

// ErrSchemaBehind: the database has not been migrated to the schema this build needs.
var ErrSchemaBehind = errors.New("database schema is behind this kasa")

// CheckSchema returns ErrSchemaBehind until the database carries every migration of this build.
// The long-running processes never migrate (as the application role they could not): they
// wait for `kasa migrate` instead. A newer schema is fine: migrations keep the previous
// release working during a rolling deploy.
func (s *Store) CheckSchema(ctx context.Context) error {
	want, err := schema.Latest()
	if err != nil {
		return err
	}
	var have int64
	err = s.pool.QueryRow(ctx, `SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`).Scan(&have)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "42P01": // no version table: never migrated
			err, have = nil, 0
		case "42501": // a migration is under way, or ran without granting this role
			return fmt.Errorf("%w: this role cannot read goose_db_version yet: run kasa migrate with KASA_DATABASE_APP_ROLE naming it", ErrSchemaBehind)
		}
	}
	if err != nil {
		return fmt.Errorf("schema version: %w", translate(err))
	}
	if have < want {
		return fmt.Errorf("%w: the database is at version %d, this build needs %d: run kasa migrate", ErrSchemaBehind, have, want)
	}
	return nil
}
