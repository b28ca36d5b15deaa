package harness

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"

	"github.com/kasa-pay/kasa/tools/bench"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// On the real Temporal Server the comparison's side measures T and new payments, and the
// payments went through that server: its process used CPU, and its database took commits,
// statements and WAL for each payment. Had kasa dev started a dev server of its own, neither
// would be so. So on kasa run as separate processes (kasa cluster), whose API hosts no worker.
func TestCompareSideOnTheRealServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := testkit.KasaBinary(t)

	cfg := testConfig(bin)
	for _, tc := range []struct {
		topology, name string
		shape          bench.Shape
	}{
		{TopologyDev, "server", bench.PaymentShape},
		{TopologyCluster, "server, split", bench.SplitShape},
	} {
		t.Run(tc.topology, func(t *testing.T) {
			st, err := startStack(ctx, cfg, TemporalServer, tc.topology, false)
			require.NoError(t, err)
			defer func() { st.stop(t.Failed()) }()
			_, err = os.Stat(filepath.Join(st.dir, "temporal"))
			require.ErrorIs(t, err, os.ErrNotExist, "kasa started no dev server of its own")

			o := bench.Options{Duration: 3 * time.Second, Warmup: time.Second, Concurrency: 4, Merchants: 5,
				Duplicates: 0.05, Insufficient: 0.05, Progress: t.Logf}
			side, err := bench.CompareSide(ctx, st.Stack, o, bench.SideOf{Name: tc.name, About: "real server", Shape: tc.shape})
			require.NoError(t, err)
			require.True(t, side.Correct, "no double charge, no invariant violation: %+v", side.Verdict)
			require.Positive(t, side.TRate)
			require.Positive(t, side.KasaRate)
			require.Positive(t, side.Ratio)
			for name, s := range map[string]bench.Summary{"T": side.T, "kasa": side.Kasa} {
				require.Positive(t, s.CPU[bench.ClassTemporal], "%s: the Temporal Server's CPU is counted", name)
				require.Positive(t, s.CPU[bench.ClassPostgres], "%s: PostgreSQL's CPU is counted", name)
				// About 25 per workflow measured here; an idle server commits a few times a second.
				require.Greater(t, s.PerOp["commits temporal"], 5.0, "%s: the workflows were persisted in the server's database", name)
				require.Greater(t, s.PerOp["statements temporal"], 5.0, "%s: and their statements counted", name)
				require.Greater(t, s.PerOp["wal bytes temporal"], 1000.0, "%s: and the WAL they wrote", name)
				require.GreaterOrEqual(t, s.PerOp["wal bytes, all"], s.PerOp["wal bytes temporal"], name)
			}
			require.Positive(t, side.Kasa.CPU[bench.ClassKasa])
			k := side.Kasa
			require.Greater(t, k.Own, k.CPU[bench.ClassKasa], "kasa's own CPU has its part of PostgreSQL")
			require.Less(t, k.Own, k.CPU[bench.ClassKasa]+k.CPU[bench.ClassPostgres], "but not the Temporal Server's part of the shared cluster")
			require.Greater(t, side.Kasa.PerOp["commits kasa"], 1.0, "kasa's own database took the payments")
			require.Greater(t, side.Kasa.PerOp["statements kasa"], 1.0)
			require.Greater(t, side.Kasa.PerOp["wal bytes kasa"], 100.0)

			md := bench.CompareMarkdown(&bench.Comparison{Options: o, Sides: []bench.Side{side}})
			require.Contains(t, md, "| "+tc.name+" | kasa |")
			require.Contains(t, md, "| statements |")
		})
	}
}

// testConfig is the harness's configuration in tests: an idempotent bank, 32 connections, the
// kasa binary given, and Temporal clients that log nothing.
func testConfig(bin string) Config {
	return Config{Capability: "idempotent", MaxConns: 32, Binary: bin,
		Dial: func(ctx context.Context, address string) (client.Client, error) {
			quiet := tlog.NewStructuredLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
			return client.DialContext(ctx, client.Options{HostPort: address, Logger: quiet})
		}}
}
