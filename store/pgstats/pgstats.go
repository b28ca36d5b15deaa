// Package pgstats reads a PostgreSQL server's own statistics for the benchmark: what its
// databases committed and wrote (pg_stat_database, pg_stat_wal), what statements ran and the WAL
// they wrote (pg_stat_statements), and which backends serve which database (pg_stat_activity).
// It only reads (and resets pg_stat_statements between runs), through the server's `postgres`
// database, so that its own queries count in none of the measured ones.
package pgstats

import (
	"context"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Settings make a server count every statement, and the WAL it wrote, by database: room for
// the real Temporal Server's few hundred distinct statements.
var Settings = []string{"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.max=10000"}

// Server is a connection to one server's statistics.
type Server struct {
	pool       *pgxpool.Pool
	statements bool // pg_stat_statements is loaded
}

// Open connects to the server of dbURL (any of its databases), on its `postgres` database.
func Open(ctx context.Context, dbURL string) (*Server, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, err
	}
	u.Path = "/postgres"
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return nil, err
	}
	_, err = pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	if err == nil {
		_, err = pool.Exec(ctx, `SELECT 1 FROM pg_stat_statements LIMIT 1`) // fails unless preloaded
	}
	return &Server{pool: pool, statements: err == nil}, nil
}

// Close closes the connections.
func (s *Server) Close() { s.pool.Close() }

// Statements says whether the server counts statements (it was started with Settings).
func (s *Server) Statements() bool { return s.statements }

// Counters reads what grows in each of dbs: "commits <db>" (read-only transactions included),
// "rows written <db>" (inserted, updated, deleted); the server's whole WAL, "wal bytes, all", and
// its "full-page images, all" (pages written whole, the first change to each after a
// checkpoint); and, with statements counted, "statements <db>" (other than transaction
// control), "wal bytes <db>" and "full-page images <db>" (what those statements wrote: commit
// records, autovacuum and checkpoints are in no database's).
func (s *Server) Counters(ctx context.Context, dbs []string) (map[string]int64, error) {
	out := map[string]int64{}
	add := func(sql string, names ...string) error {
		rows, err := s.pool.Query(ctx, sql, dbs)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var db string
			vals := make([]int64, len(names))
			dest := []any{&db}
			for i := range vals {
				dest = append(dest, &vals[i])
			}
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			for i, n := range names {
				out[strings.TrimSpace(n+" "+db)] = vals[i]
			}
		}
		return rows.Err()
	}
	err := add(`SELECT datname, xact_commit, tup_inserted + tup_updated + tup_deleted FROM pg_stat_database WHERE datname = ANY($1)`,
		"commits", "rows written")
	if err == nil {
		err = add(`SELECT '', (pg_current_wal_lsn() - '0/0')::bigint, wal_fpi FROM pg_stat_wal WHERE $1::text[] IS NOT NULL`,
			"wal bytes, all", "full-page images, all")
	}
	if err == nil && s.statements {
		err = add(`SELECT d.datname,
			coalesce(sum(s.calls) FILTER (WHERE s.query !~* '^\s*(begin|commit|rollback|start transaction|savepoint|release|end)\M'), 0)::bigint,
			coalesce(sum(s.wal_bytes), 0)::bigint, coalesce(sum(s.wal_fpi), 0)::bigint
			FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = ANY($1) GROUP BY d.datname`,
			"statements", "wal bytes", "full-page images")
	}
	return out, err
}

// Observer is the application_name of the benchmark's own connections to a measured database
// (ObserverURL): their backends serve that database, but for the benchmark, not for it.
const Observer = "kasa-bench"

// ObserverURL is dbURL for the benchmark's own connections: named Observer.
func ObserverURL(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("application_name", Observer)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Backends maps the process ids of the server's backends (autovacuum workers included) to
// whether they serve db; the benchmark's own (Observer) do not.
func (s *Server) Backends(ctx context.Context, db string) (map[int]bool, error) {
	rows, err := s.pool.Query(ctx, `SELECT pid, datname = $1 AND application_name IS DISTINCT FROM $2
		FROM pg_stat_activity WHERE datname IS NOT NULL`, db, Observer)
	if err != nil {
		return nil, err
	}
	m := map[int]bool{}
	var pid int
	var of bool
	_, err = pgx.ForEachRow(rows, []any{&pid, &of}, func() error { m[pid] = of; return nil })
	return m, err
}

// WALBytes is the position of the server's WAL, in bytes from its start.
func (s *Server) WALBytes(ctx context.Context) (int64, error) {
	var lsn int64
	err := s.pool.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - '0/0')::bigint`).Scan(&lsn)
	return lsn, err
}

// ResetStatements forgets the statements counted so far.
func (s *Server) ResetStatements(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	return err
}

// Transactions is how many transactions a script of one transaction per run ran on db since the
// last reset: every statement runs once per transaction, so the most called one counts them.
func (s *Server) Transactions(ctx context.Context, db string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
		WHERE d.datname = $1 AND s.query !~* '^\s*(begin|commit)'`, db).Scan(&n)
	return n, err
}

// Statement is one statement's figures since the last reset.
type Statement struct {
	Query        string // whitespace folded, at most 200 characters
	Calls        int64
	MeanMS       float64
	SharePercent float64 // of all statements' execution time on the database
	WALBytes     float64 // per call
}

// TopStatements are db's n costliest statements (by total execution time) since the last reset,
// transaction control apart.
func (s *Server) TopStatements(ctx context.Context, db string, n int) ([]Statement, error) {
	rows, err := s.pool.Query(ctx, `SELECT regexp_replace(s.query, '\s+', ' ', 'g'), s.calls, s.mean_exec_time,
	coalesce(100 * s.total_exec_time / nullif(sum(s.total_exec_time) OVER (), 0), 0), s.wal_bytes::float8 / greatest(s.calls, 1)
FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = $1 AND s.query !~* '^\s*(begin|commit|rollback)'
ORDER BY s.total_exec_time DESC LIMIT $2`, db, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Statement, error) {
		var st Statement
		err := r.Scan(&st.Query, &st.Calls, &st.MeanMS, &st.SharePercent, &st.WALBytes)
		if q := []rune(st.Query); len(q) > 200 {
			st.Query = string(q[:200]) + "…"
		}
		return st, err
	})
}
