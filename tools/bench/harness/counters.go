package harness

import (
	"context"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// statsSettings make a PostgreSQL the harness starts count every statement, and the WAL it
// wrote, by database (pg_stat_statements): room for Temporal's few hundred distinct statements.
var statsSettings = []string{"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.max=10000"}

// measuredDatabases are kasa's database and the real Temporal Server's persistence and visibility.
var measuredDatabases = []string{"kasa", "temporal", "temporal_visibility"}

// databaseCounters reads, through a pool on the cluster's `postgres` database (so that its own
// queries count in none of the measured ones), what grows in the measured databases: for each,
// "commits <db>" (pg_stat_database.xact_commit, read-only transactions included) and "rows written
// <db>" (rows inserted, updated and deleted); the cluster's whole WAL as "wal bytes, all" and
// its "full-page images, all" (pages written whole, the first change to each after a checkpoint);
// and, where pg_stat_statements is loaded, "statements <db>" (executions of statements other
// than transaction control), "wal bytes <db>" and "full-page images <db>" (what those statements
// wrote; commit records, autovacuum and checkpoint records are in no database's).
//
// kasaBackends maps the process ids of the cluster's backends (autovacuum workers included) to
// whether they serve dbURL's database, for StackCPU to tell kasa's part of PostgreSQL's CPU.
func databaseCounters(ctx context.Context, dbURL string) (count func(context.Context) (map[string]int64, error), kasaBackends func() map[int]bool, closePool func(), err error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return nil, nil, nil, err
	}
	kasaDB := strings.TrimPrefix(u.Path, "/")
	u.Path = "/postgres"
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		return nil, nil, nil, err
	}
	kasaBackends = func() map[int]bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rows, err := pool.Query(ctx, `SELECT pid, datname = $1 FROM pg_stat_activity WHERE datname IS NOT NULL`, kasaDB)
		if err != nil {
			return nil
		}
		m := map[int]bool{}
		var pid int
		var kasa bool
		if _, err := pgx.ForEachRow(rows, []any{&pid, &kasa}, func() error { m[pid] = kasa; return nil }); err != nil {
			return nil
		}
		return m
	}
	_, err = pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
	if err == nil {
		_, err = pool.Exec(ctx, `SELECT 1 FROM pg_stat_statements LIMIT 1`) // fails unless preloaded
	}
	statements := err == nil
	count = func(ctx context.Context) (map[string]int64, error) {
		out := map[string]int64{}
		add := func(sql string, names ...string) error {
			rows, err := pool.Query(ctx, sql, measuredDatabases)
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
		if err == nil && statements {
			err = add(`SELECT d.datname,
				coalesce(sum(s.calls) FILTER (WHERE s.query !~* '^\s*(begin|commit|rollback|start transaction|savepoint|release|end)\M'), 0)::bigint,
				coalesce(sum(s.wal_bytes), 0)::bigint, coalesce(sum(s.wal_fpi), 0)::bigint
				FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = ANY($1) GROUP BY d.datname`,
				"statements", "wal bytes", "full-page images")
		}
		return out, err
	}
	return count, kasaBackends, pool.Close, nil
}
