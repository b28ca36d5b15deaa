package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

func TestReadPGBenchLogs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prefix := filepath.Join(dir, "tx")
	// The run starts at 1000.0 (client 0's first transaction: 1000.5 minus 500 ms) and ends at
	// 1003.0 (the last one). With a 1 s warmup the window opens at 1001.5, when client 1 has done
	// its fifth transaction.
	require.NoError(t, os.WriteFile(prefix+".100", []byte(`0 1 500000 0 1000 500000
0 2 1000 0 1000 600000
0 3 1000 0 1000 700000
0 4 1000 0 1000 800000
0 5 1000 0 1000 900000
0 6 1500 0 1001 100000
0 7 failed 0 1002 0
0 8 skipped 0 1002 100000
0 9 900 0 1003 0
`), 0o644))
	require.NoError(t, os.WriteFile(prefix+".100.1", []byte(`1 1 100 0 1000 100000
1 2 100 0 1000 200000
1 3 100 0 1000 300000
1 4 100 0 1000 400000
1 5 100 0 1001 500000
1 6 2500 0 1002 999999
`), 0o644))
	txs, err := readPGBenchLogs(prefix)
	require.NoError(t, err)
	require.Len(t, txs, 14)
	r := summarize(txs, time.Second)
	require.InDelta(t, 2/1.5, r.TPS, 1e-9)
	r.TPS = 0
	require.Equal(t, PGBenchResult{Duration: 1.5, LatencyAvgMS: 1.7, P50MS: 0.9, P99MS: 2.5, MaxMS: 2.5, Transactions: 2, Failed: 1}, r)
	// Without a warmup the window opens at the last client's fifth transaction all the same.
	require.Equal(t, int64(2), summarize(txs, 0).Transactions)
	// A run too short (or a machine too busy) for every client to warm up: the time alone counts.
	var short []pgbenchTx
	for _, tx := range txs {
		if tx.client == 1 && tx.n <= 5 {
			short = append(short, tx)
		}
	}
	require.Equal(t, int64(1), summarize(short, time.Second).Transactions, "client 1's fifth ends after the 1 s warmup")
	require.Equal(t, 500*time.Microsecond, quantile([]time.Duration{500 * time.Microsecond, 1500 * time.Microsecond, 2500 * time.Microsecond}, 0))
	_, err = readPGBenchLogs(filepath.Join(dir, "none"))
	require.Error(t, err)
}

func TestWithSearchPath(t *testing.T) {
	t.Parallel()
	got, err := withSearchPath("postgres://u:p@127.0.0.1:5432/kasa?sslmode=disable&options=-cstatement_timeout%3D0", "kasa_pgbench_x")
	require.NoError(t, err)
	require.Equal(t, "postgres://u:p@127.0.0.1:5432/kasa?options=-cstatement_timeout%3D0%20-c%20search_path%3Dkasa_pgbench_x&sslmode=disable", got)
	_, err = withSearchPath("host=127.0.0.1 dbname=kasa", "s")
	require.ErrorContains(t, err, "postgres:// URL")
}

// TestPGBench runs every script against a throwaway PostgreSQL with kasa's schema and a little
// real data, and checks that only the fixture schema was written, and that it is gone afterwards.
func TestPGBench(t *testing.T) {
	ctx := context.Background()
	env := testkit.Start(t, testkit.Options{})
	db := env.Store

	// Some real rows, so that "untouched" means something.
	m := testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "real", Deposit: 10_000})
	req := payment.Request{InvoiceID: "inv-1", AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: payment.DefaultPaymentType}
	_, p, _, err := db.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: "k1", Request: req, OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.NoError(t, db.Reserve(ctx, p.ID))
	_, err = db.Finalize(ctx, p.ID, "ch_1")
	require.NoError(t, err)

	snapshot := func() string {
		out, err := PSQL(ctx, env.DatabaseURL, testSQL(t, "snapshot"), "-A", "-t")
		require.NoError(t, err)
		return strings.TrimSpace(out)
	}
	schemas := func() string {
		out, err := PSQL(ctx, env.DatabaseURL, testSQL(t, "schemas"), "-A", "-t")
		require.NoError(t, err)
		return strings.TrimSpace(out)
	}
	before := snapshot()
	require.True(t, strings.HasPrefix(before, "1 3 "), "real rows: %s", before)

	t.Run("fixture clones constraints, foreign keys and triggers", func(t *testing.T) {
		const schema = "kasa_pgbench_fixture_test"
		vars := pgbenchVariables(3)
		require.NoError(t, setupPGBenchFixture(ctx, env.DatabaseURL, "setup", schema, append(vars, "payers=2"))) // the last -v wins
		defer func() {
			_, err := psqlScript(ctx, env.DatabaseURL, "psql/drop", "-v", "schema="+schema)
			require.NoError(t, err)
		}()
		u, err := withSearchPath(env.DatabaseURL, schema)
		require.NoError(t, err)
		q := func(name string) (string, error) {
			out, err := PSQL(ctx, u, testSQL(t, name), "-A", "-t")
			return strings.TrimSpace(out), err
		}
		out, err := q("fixture-counts")
		require.NoError(t, err)
		require.Equal(t, "3|9|3", out)
		// The -D value PGBench passes to the replay script is merchant 1's id.
		out, err = q("merchant-1")
		require.NoError(t, err)
		require.Contains(t, vars, "merchant_id="+out)
		_, err = q("unbalanced-posting")
		require.ErrorContains(t, err, "does not balance")
		_, err = q("payment-without-account")
		require.ErrorContains(t, err, "foreign key")
		_, err = q("overdraw")
		require.ErrorContains(t, err, "accounts_funds")
	})

	for _, script := range []string{PGBenchPayment, PGBenchAccept, PGBenchReplay, PGBenchMinimal} {
		t.Run(script, func(t *testing.T) {
			r, err := PGBench(ctx, PGBenchOptions{DatabaseURL: env.DatabaseURL, Clients: 4, Duration: 2 * time.Second, Script: script, Rows: 100})
			require.NoError(t, err)
			t.Logf("%s: %.0f tx/s, avg %.2f ms, p50 %.2f ms, p99 %.2f ms, %d transactions", script, r.TPS, r.LatencyAvgMS, r.P50MS, r.P99MS, r.Transactions)
			require.Equal(t, script, r.Script)
			require.Equal(t, 4, r.Clients)
			require.Greater(t, r.TPS, 0.0)
			require.Positive(t, r.Transactions)
			require.Zero(t, r.Failed)
			require.Positive(t, r.P50MS)
			// The window excludes the warm-up (else it would read ~3 s); it spans the first to the
			// last logged transaction, so a loaded machine starting late shortens it a little.
			require.LessOrEqual(t, r.Duration, 2.2)
			require.Greater(t, r.Duration, 1.0)
			require.GreaterOrEqual(t, r.P99MS, r.P50MS)
			require.Equal(t, before, snapshot(), "kasa's tables were written")
			require.Empty(t, schemas(), "fixture schema left behind")
		})
	}

	t.Run("errors", func(t *testing.T) {
		_, err := PGBench(ctx, PGBenchOptions{DatabaseURL: env.DatabaseURL, Script: "setup"})
		require.ErrorContains(t, err, "unknown script")
		// More clients than max_connections: pgbench fails, and says why.
		_, err = PGBench(ctx, PGBenchOptions{DatabaseURL: env.DatabaseURL, Script: PGBenchReplay, Clients: 300, Duration: time.Second, Rows: 1})
		require.ErrorContains(t, err, "too many clients")
		require.Empty(t, schemas(), "fixture schema left behind")
	})

	problems, err := db.Verify(ctx)
	require.NoError(t, err)
	require.Empty(t, problems)
	require.Equal(t, before, snapshot())
}

// testSQL reads testdata/pgbench/name.sql, a statement the tests run through psql.
func testSQL(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "pgbench", name+".sql"))
	require.NoError(t, err)
	return b
}
