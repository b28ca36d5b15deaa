// Package schema owns kasa's DDL: goose migrations embedded in the binary.
package schema

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"path"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed migrations/*.sql
var migrations embed.FS

// grants is every privilege of the application role, written for psql's variables (:"name").
//
//go:embed grants.sql
var grants string

// TryLockWait is how long one try of a migration waits for a table's lock: the SET LOCAL
// lock_timeout of every migration that alters a table the running release uses. Every read and
// write of that table queues behind the waiting lock, so this is how long a payment may stall.
const TryLockWait = time.Second

// DefaultLockWait is how long Migrate keeps trying a migration that cannot take its locks.
const DefaultLockWait = 10 * time.Minute

// ErrLockWait is a migration that could not take its table locks within Options.LockWait:
// another transaction kept a conflicting lock all along. What failed was rolled back (or, for a
// migration outside a transaction, is taken again from its start), so running it again is safe.
var ErrLockWait = errors.New("gave up waiting for a table lock")

// Options tune Migrate.
type Options struct {
	// LockWait bounds how long a migration is tried again while another transaction holds a lock
	// it needs (0: DefaultLockWait).
	LockWait time.Duration
	Logger   *slog.Logger // each try that could not take its lock; nil: slog.Default()
}

// Migrate applies every pending migration. Concurrent callers are serialised by goose's
// session lock, so every kasa process may call it at start.
//
// The previous release keeps serving meanwhile. A migration that alters a hot table waits at
// most TryLockWait for its lock (lock_timeout), since every query on that table queues behind
// it; when a longer transaction holds the table (a report, the ledger check), the try fails
// and rolls back, and Migrate tries again after a pause that grows to 30 s (during which it
// holds no lock of that table), until LockWait has passed since its first such try: then it
// returns ErrLockWait.
func Migrate(ctx context.Context, db *sql.DB, o Options) error {
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
	log := cmp.Or(o.Logger, slog.Default())
	var (
		last          *goose.PartialError // the last try that could not take its lock
		tries         int                 // of last's migration, since start
		start, giveUp time.Time
		pause         time.Duration
	)
	for {
		_, err := p.Up(ctx)
		var partial *goose.PartialError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &partial) && lockConflict(partial.Err):
			if last == nil || partial.Failed.Source.Version != last.Failed.Source.Version {
				// Each migration gets LockWait from its first try that met a lock.
				tries, pause, start = 0, TryLockWait, time.Now()
				giveUp = start.Add(cmp.Or(o.LockWait, DefaultLockWait))
			}
			last = partial
			tries++
		case last != nil && ctx.Err() != nil:
			// Stopped (SIGTERM) during a try or between tries: the wait is what ended.
			return lockWaitError(last, tries, start, ctx.Err())
		default:
			return fmt.Errorf("migrate: %w", err)
		}
		left := time.Until(giveUp)
		if left <= 0 {
			return lockWaitError(last, tries, start, nil)
		}
		// A pause of half to all of pause (two kasa migrate never retry in step), the last one
		// ending when LockWait does.
		wait := min(pause/2+rand.N(pause/2+1), left)
		log.Warn("migration waits for a table lock that another transaction holds; trying again",
			"migration", path.Base(last.Failed.Source.Path), "try", tries, "next_try_in", wait.Round(time.Millisecond),
			"gives_up_in", left.Round(time.Second), "error", last.Err)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		pause = min(2*pause, 30*time.Second)
	}
}

// lockWaitError is Migrate giving up on last's migration, after its tries or when stopped.
func lockWaitError(last *goose.PartialError, tries int, start time.Time, stopped error) error {
	why := fmt.Sprintf("after %s", time.Since(start).Round(time.Second))
	if stopped != nil {
		why = fmt.Sprintf("stopped (%v) %s", stopped, why)
	}
	return fmt.Errorf("migrate: %w, %s: migration %s tried %d time(s) while another transaction held a lock "+
		"it needs (look for long transactions in pg_stat_activity); nothing of it is recorded as applied, "+
		"and kasa migrate takes it again from its start: %w", ErrLockWait, why, path.Base(last.Failed.Source.Path), tries, last.Err)
}

// lockConflict is a statement that could not take a lock in time (lock_timeout) or lost a
// deadlock over one: a later try may succeed.
func lockConflict(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "55P03" || pg.Code == "40P01")
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
