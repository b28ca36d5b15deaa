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

// On the real Temporal Server a run of T and one of new payments count every process and both
// databases: the server's process used CPU, and its database took commits, statements and WAL
// for each workflow. Had kasa dev started a dev server of its own, neither would be so. Also on
// kasa run as separate processes (kasa cluster), whose API hosts no worker.
func TestRealServerRunsCountEveryProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := testkit.KasaBinary(t)

	cfg := testConfig(bin)
	for _, tc := range []struct {
		topology string
		shape    bench.Shape
	}{
		{TopologyDev, bench.PaymentShape},
		// The API hosts no worker (kasa api beside kasa worker): the start cannot be eager.
		{TopologyCluster, bench.Shape{Steps: "LLLL", SearchAttributes: true}},
	} {
		t.Run(tc.topology, func(t *testing.T) {
			st, err := startStack(ctx, cfg, TemporalServer, tc.topology, false)
			require.NoError(t, err)
			defer func() { st.stop(t.Failed()) }()
			_, err = os.Stat(filepath.Join(st.dir, "temporal"))
			require.ErrorIs(t, err, os.ErrNotExist, "kasa started no dev server of its own")

			o := bench.Options{APIURL: st.APIURL, AdminToken: st.AdminToken, CPU: st.CPU, Counters: st.Counters,
				Duration: 3 * time.Second, Warmup: time.Second, Concurrency: 4, Merchants: 5, Payers: 1,
				Duplicates: 0.05, Insufficient: 0.05, Progress: t.Logf}
			fx, err := bench.Setup(ctx, o)
			require.NoError(t, err)
			require.NoError(t, st.Settle(ctx))
			tRun, err := bench.WorkflowCeiling(ctx, st.Temporal, tc.shape, o)
			require.NoError(t, err)
			kasa, err := bench.Run(ctx, o, fx)
			require.NoError(t, err)
			v, err := st.Check(ctx, kasa.Payments, kasa.RefundsSeen, kasa.ManualSeen)
			require.NoError(t, err)
			require.True(t, v.Correct, "no double charge, no invariant violation: %+v", v)
			require.Positive(t, tRun.Throughput)
			require.Positive(t, kasa.NewPaymentRate)
			for name, r := range map[string]bench.Result{"T": tRun, "kasa": kasa} {
				require.NotNil(t, r.CPU, name)
				require.Positive(t, r.CPU.MS[bench.ClassTemporal], "%s: the Temporal Server's CPU is counted", name)
				require.Positive(t, r.CPU.MS[bench.ClassPostgres], "%s: PostgreSQL's CPU is counted", name)
				// About 25 per workflow measured here; an idle server commits a few times a second.
				require.Greater(t, r.PerOp["commits temporal"], 5.0, "%s: the workflows were persisted in the server's database", name)
				require.Greater(t, r.PerOp["statements temporal"], 5.0, "%s: and their statements counted", name)
				require.Greater(t, r.PerOp["wal bytes temporal"], 1000.0, "%s: and the WAL they wrote", name)
				require.GreaterOrEqual(t, r.PerOp["wal bytes, all"], r.PerOp["wal bytes temporal"], name)
			}
			k := kasa.CPU
			require.Positive(t, k.MS[bench.ClassKasa])
			require.Greater(t, k.Own.MS, k.MS[bench.ClassKasa], "kasa's own CPU has its part of PostgreSQL")
			require.Less(t, k.Own.MS, k.MS[bench.ClassKasa]+k.MS[bench.ClassPostgres], "but not the Temporal Server's part of the shared cluster")
			require.Greater(t, kasa.PerOp["commits kasa"], 1.0, "kasa's own database took the payments")
			require.Greater(t, kasa.PerOp["statements kasa"], 1.0)
			require.Greater(t, kasa.PerOp["wal bytes kasa"], 100.0)
			require.Contains(t, bench.RunText(kasa), "statements kasa")
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
