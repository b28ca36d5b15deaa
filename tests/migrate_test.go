package tests

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/schema"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// The operator's view of kasa migrate behind a long transaction on a table a migration alters:
// it says which migration waits and when it tries again, gives up after
// KASA_DATABASE_MIGRATE_LOCK_WAIT with exit 3 and nothing of the migration applied, and
// completes when run again after that transaction.
func TestMigrateBehindALongTransactionExits3AndRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := crashDir(t)
	bin := kasaBinary(t, dir)
	url := env.OwnDatabase(t)
	own, err := store.Open(ctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: true})
	require.NoError(t, err)
	own.Close()
	c := connect(t, url)
	// As a database of the release before migration 34.
	for _, sql := range []string{`ALTER TABLE payments DROP COLUMN unknown_at`, `ALTER TABLE refunds DROP COLUMN unknown_at`,
		`DELETE FROM goose_db_version WHERE version_id >= 34`} {
		_, err := c.Exec(ctx, sql)
		require.NoError(t, err)
	}
	reader := connect(t, url)
	tx, err := reader.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM payments`)
	require.NoError(t, err)

	migrate := kasaEnv(map[string]string{"KASA_DATABASE_URL": url, "KASA_DATABASE_MIGRATE_LOCK_WAIT": "4s"})
	start := time.Now()
	out, code := runKasa(t, dir, bin, migrate, "migrate")
	require.Equal(t, 3, code, "%s", out)
	require.Less(t, time.Since(start), 20*time.Second, "%s", out)
	require.Contains(t, out, `msg="migration waits for a table lock that another transaction holds; trying again" migration=00034_unknown_at.sql try=1 `, "%s", out)
	require.Contains(t, out, "gave up waiting for a table lock", "%s", out)
	require.Contains(t, out, "nothing of it is recorded as applied", "%s", out)
	t.Logf("kasa migrate:\n%s", out)
	var version int64
	var column bool
	state := `SELECT (SELECT max(version_id) FROM goose_db_version),
		EXISTS (SELECT 1 FROM information_schema.columns WHERE table_name = 'payments' AND column_name = 'unknown_at')`
	require.NoError(t, c.QueryRow(ctx, state).Scan(&version, &column))
	require.EqualValues(t, 33, version)
	require.False(t, column, "nothing of migration 34 applied")

	require.NoError(t, tx.Rollback(ctx))
	out, code = runKasa(t, dir, bin, migrate, "migrate")
	require.Zero(t, code, "%s", out)
	require.NotContains(t, out, "waits for a table lock", "%s", out)
	latest, err := schema.Latest()
	require.NoError(t, err)
	require.NoError(t, c.QueryRow(ctx, state).Scan(&version, &column))
	require.Equal(t, latest, version)
	require.True(t, column)
}
