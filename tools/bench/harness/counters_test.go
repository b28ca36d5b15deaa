package harness

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/devenv"
)

// On a cluster started with statsSettings the counters split statements and their WAL by
// database: work done in one database shows under its name and not under another's, and the
// cluster's whole WAL covers at least what the statements wrote.
func TestDatabaseCountersSplitByDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, err := devenv.StartPostgres(ctx, devenv.PostgresOptions{Dir: filepath.Join(t.TempDir(), "pg"), Database: "kasa",
		Settings: statsSettings, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer pg.Stop()
	count, kasaBackends, closeCounters, err := databaseCounters(ctx, pg.URL)
	require.NoError(t, err)
	defer closeCounters()

	kasa, err := pgxpool.New(ctx, pg.URL)
	require.NoError(t, err)
	defer kasa.Close()
	_, err = kasa.Exec(ctx, `CREATE TABLE t (id bigint PRIMARY KEY, v text)`)
	require.NoError(t, err)

	_, err = kasa.Exec(ctx, `INSERT INTO t VALUES (-1, 'x'); CHECKPOINT`)
	require.NoError(t, err)
	var kasaPID int
	require.NoError(t, kasa.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&kasaPID))
	backends := kasaBackends()
	require.Contains(t, backends, kasaPID)
	require.True(t, backends[kasaPID], "a backend of kasa's database is kasa's")
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
	kasa.Close() // a backend reports its commits and rows within a second, and at once as it exits
	after, err := count(ctx)
	require.NoError(t, err)
	grew := func(name string) int64 { return after[name] - before[name] }

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

// A second report on a day gets a name of its own rather than writing over the first.
func TestFreeBaseKeepsEarlierReports(t *testing.T) {
	dir := t.TempDir()
	for _, want := range []string{"day", "day-2", "day-3"} {
		base := freeBase(dir, "day")
		require.Equal(t, filepath.Join(dir, want), base)
		require.NoError(t, os.WriteFile(base+".md", nil, 0o644))
	}
}
