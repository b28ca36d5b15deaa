// Package schema owns kasa's DDL: goose migrations embedded in the binary.
package schema

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var migrations embed.FS

// grants is every privilege of the application role, written for psql's variables (:"name").
//
//go:embed grants.sql
var grants string

// Migrate applies every pending migration. Concurrent callers are serialised by goose's
// session lock, so every kasa process may call it at start.
func Migrate(ctx context.Context, db *sql.DB) error {
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// Latest is the version of the newest embedded migration: the schema this build needs.
func Latest() (int64, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return 0, err
	}
	var latest int64
	for _, n := range names {
		v, err := goose.NumericComponent(path.Base(n))
		if err != nil {
			return 0, fmt.Errorf("migration %s: %w", n, err)
		}
		latest = max(latest, v)
	}
	return latest, nil
}

// Grant gives role exactly the privileges of grants.sql on the tables of the current schema, in
// one transaction: it must run as their owner (after Migrate). It refuses a role that could act
// as the owner, and fails when a table is missing from grants.sql, so that a new table is never
// silently out of the application's reach.
func Grant(ctx context.Context, db *sql.DB, role string) error {
	if role == "" {
		return errors.New("grant: no application role named")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	// Every process may migrate at start: two REVOKE/GRANT rounds at once fail on each other's
	// catalog rows, so they take turns.
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('kasa/grant', 0))`); err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	var schemaName, owner string
	var exists, super, member bool
	err = tx.QueryRowContext(ctx, `SELECT current_schema(), current_user,
		EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1),
		coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = $1), false),
		coalesce((SELECT pg_has_role($1, current_user, 'MEMBER') FROM pg_roles WHERE rolname = $1), false)`, role).
		Scan(&schemaName, &owner, &exists, &super, &member)
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	switch {
	case !exists:
		return fmt.Errorf("grant: role %q does not exist (CREATE ROLE %s LOGIN PASSWORD '...')", role, quoteIdent(role))
	case super:
		return fmt.Errorf("grant: role %q is a superuser: it bypasses every privilege, so it cannot be the application role", role)
	case member:
		return fmt.Errorf("grant: role %q is the owner %q or a member of it: it could alter the tables and drop their triggers; use a role of its own", role, owner)
	}
	stmt := strings.NewReplacer(`:"app_role"`, quoteIdent(role), `:"schema"`, quoteIdent(schemaName)).Replace(grants)
	if _, err := tx.ExecContext(ctx, stmt); err != nil {
		return fmt.Errorf("grant to %s: %w", role, err)
	}
	rows, err := tx.QueryContext(ctx, `SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname <> 'goose_db_version'
		  AND NOT has_table_privilege($1, c.oid, 'SELECT') ORDER BY 1`, role)
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	var missing []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		missing = append(missing, name)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("grant: schema/grants.sql does not name table(s) %s: add what the application does with them", strings.Join(missing, ", "))
	}
	return tx.Commit()
}

// quoteIdent quotes a name as an SQL identifier.
func quoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}
