package pgstats

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// startServer starts a PostgreSQL cluster of the test's own, counting statements, and opens its
// statistics; it returns the URL of its database kasa.
func startServer(t *testing.T) (string, *Server) {
	t.Helper()
	ctx := context.Background()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(t.TempDir(), "pg"), Database: "kasa",
		Settings: Settings, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Stop() })
	srv, err := Open(ctx, pg.URL)
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	return pg.URL, srv
}

// On a server started with Settings the counters split statements and their WAL by
// database: work done in one database shows under its name and not under another's, and the
// cluster's whole WAL covers at least what the statements wrote.
func TestCountersSplitByDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pgURL, srv := startServer(t)
	require.True(t, srv.Statements())
	dbs := []string{"kasa", "temporal"}
	count := func(ctx context.Context) (map[string]int64, error) { return srv.Counters(ctx, dbs) }

	kasa, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	defer kasa.Close()
	_, err = kasa.Exec(ctx, `CREATE TABLE t (id bigint PRIMARY KEY, v text)`)
	require.NoError(t, err)

	_, err = kasa.Exec(ctx, `INSERT INTO t VALUES (-1, 'x'); CHECKPOINT`)
	require.NoError(t, err)
	var kasaPID int
	require.NoError(t, kasa.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&kasaPID))
	observerURL, err := ObserverURL(pgURL)
	require.NoError(t, err)
	observer, err := pgx.Connect(ctx, observerURL)
	require.NoError(t, err)
	defer observer.Close(ctx)
	var observerPID int
	require.NoError(t, observer.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&observerPID))
	backends, err := srv.Backends(ctx, "kasa")
	require.NoError(t, err)
	require.Contains(t, backends, kasaPID)
	require.True(t, backends[kasaPID], "a backend of kasa's database is kasa's")
	require.Contains(t, backends, observerPID)
	require.False(t, backends[observerPID], "the benchmark's own backend on kasa's database is not kasa's")
	others := 0
	for _, kasa := range backends {
		if !kasa {
			others++
		}
	}
	require.Positive(t, others, "the counters' own backend, on database postgres, is not kasa's")
	before, err := count(ctx)
	require.NoError(t, err)
	const n = 200
	for i := range n {
		err := pgx.BeginFunc(ctx, kasa, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO t VALUES ($1, repeat('x', 100))`, i)
			return err
		})
		require.NoError(t, err)
	}
	kasa.Close() // a backend reports its commits and rows within a second, and as it exits
	var after map[string]int64
	grew := func(name string) int64 { return after[name] - before[name] }
	require.Eventually(t, func() bool {
		after, err = count(ctx)
		require.NoError(t, err)
		return grew("commits kasa") >= n && grew("rows written kasa") >= n
	}, 10*time.Second, 50*time.Millisecond, "the backends' statistics arrive")

	require.GreaterOrEqual(t, grew("statements kasa"), int64(n), "every insert is a statement; BEGIN and COMMIT are not counted")
	require.Less(t, grew("statements kasa"), int64(n+10))
	require.GreaterOrEqual(t, grew("commits kasa"), int64(n))
	require.GreaterOrEqual(t, grew("rows written kasa"), int64(n))
	require.Greater(t, grew("wal bytes kasa"), int64(n*100), "each row's 100 bytes went to the WAL")
	require.GreaterOrEqual(t, grew("wal bytes, all"), grew("wal bytes kasa"), "the cluster's WAL includes the statements' and the commit records")
	require.Positive(t, grew("full-page images kasa"), "the table's page was first written after a checkpoint: whole, once")
	require.GreaterOrEqual(t, grew("full-page images, all"), grew("full-page images kasa"))
	require.Zero(t, grew("statements temporal"), "nothing ran in the other databases")
	require.Zero(t, grew("wal bytes temporal"))
}

// The costliest statements since a reset are the database's own, and a reset forgets them.
func TestTopStatementsAndReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pgURL, srv := startServer(t)
	kasa, err := pgxpool.New(ctx, pgURL)
	require.NoError(t, err)
	defer kasa.Close()

	require.NoError(t, srv.ResetStatements(ctx))
	for range 5 {
		_, err := kasa.Exec(ctx, `SELECT   count(*)
			FROM pg_class`)
		require.NoError(t, err)
	}
	top, err := srv.TopStatements(ctx, "kasa", 12)
	require.NoError(t, err)
	var found *Statement
	for i := range top {
		if top[i].Query == "SELECT count(*) FROM pg_class" {
			found = &top[i]
		}
	}
	require.NotNil(t, found, "whitespace folded: %+v", top)
	require.EqualValues(t, 5, found.Calls)
	txs, err := srv.Transactions(ctx, "kasa")
	require.NoError(t, err)
	require.GreaterOrEqual(t, txs, int64(5))
	before, err := srv.WALBytes(ctx)
	require.NoError(t, err)
	_, err = kasa.Exec(ctx, `CREATE TABLE w (v text); INSERT INTO w SELECT repeat('x', 1000) FROM generate_series(1, 100)`)
	require.NoError(t, err)
	after, err := srv.WALBytes(ctx)
	require.NoError(t, err)
	require.Greater(t, after-before, int64(100*1000), "the rows went to the WAL")

	require.NoError(t, srv.ResetStatements(ctx))
	top, err = srv.TopStatements(ctx, "kasa", 12)
	require.NoError(t, err)
	for _, st := range top {
		require.NotEqual(t, "SELECT count(*) FROM pg_class", st.Query, "forgotten by the reset")
	}
}
