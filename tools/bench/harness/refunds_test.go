package harness

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/bench"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// A run with a refund mix on a real kasa dev refunds parts of its payments at about the share
// asked; the bank simulator moved money back once for each refund kasa has succeeded and for
// no other, each payment's refunded amount is the sum of its succeeded refunds, and the
// check and kasa verify find nothing wrong.
func TestRefundMixOnKasaDev(t *testing.T) {
	ctx := context.Background()
	cli, err := devenv.FindTemporalCLI()
	require.NoError(t, err)
	t.Setenv("KASA_TEMPORAL_CLI", cli)
	dir := t.TempDir()
	bin := testkit.KasaBinary(t)
	cfg := testConfig(bin)
	st, err := startStack(ctx, cfg, TemporalDev, TopologyDev, true)
	require.NoError(t, err)
	defer func() { st.stop(t.Failed()) }()

	o := bench.Options{APIURL: st.APIURL, AdminToken: st.AdminToken, Duration: 4 * time.Second, Warmup: time.Second,
		Concurrency: 4, Merchants: 3, Payers: 2, Duplicates: 0.05, Insufficient: 0.05, RefundShare: 0.3, CPU: st.CPU}
	fx, err := bench.Setup(ctx, o)
	require.NoError(t, err)
	profile := filepath.Join(dir, "cpu.pprof")
	profiled := make(chan error, 1)
	go func() { profiled <- fetchProfile(ctx, st.pprofURL, profile, o.Warmup, o.Duration) }()
	res, err := bench.Run(ctx, o, fx)
	require.NoError(t, err)
	require.NoError(t, <-profiled)
	prof, err := os.ReadFile(profile)
	require.NoError(t, err)
	require.Equal(t, []byte{0x1f, 0x8b}, prof[:2], "a CPU profile: gzipped protobuf")
	api, err := http.Get(st.APIURL + "/debug/pprof/")
	require.NoError(t, err)
	api.Body.Close()
	require.Equal(t, http.StatusNotFound, api.StatusCode, "never on the API's port")

	// The simulator is a process of its own: its CPU is not kasa's, which has its own figure.
	c := res.CPU
	require.NotNil(t, c)
	require.Positive(t, c.MS[bench.ClassBanksim], "%v", c.MS)
	require.Positive(t, c.MS[bench.ClassKasa])
	require.Positive(t, c.PostgresBackends["kasa"], "kasa's backends are told apart")
	require.InDelta(t, c.MS[bench.ClassKasa]+c.Own.Postgres, c.Own.MS, 1e-9)
	require.LessOrEqual(t, c.Own.Postgres, c.MS[bench.ClassPostgres])
	require.Greater(t, c.Own.Postgres, 0.8*c.MS[bench.ClassPostgres], "kasa dev's PostgreSQL serves kasa alone, but for the bench's counters")
	require.Positive(t, c.Own.Ratio)
	require.Zero(t, res.Errors, res.FirstError)
	rs := res.Refunds
	require.NotNil(t, rs)
	require.Positive(t, rs.New)
	require.Positive(t, rs.Rate)
	require.Positive(t, res.Answers["refund 201 succeeded"], "%v", res.Answers)
	require.Zero(t, res.Answers["refund 409 refund_exceeds_refundable"], "never more than is left")
	require.InDelta(t, 0.3, float64(rs.Requests)/float64(res.Requests), 0.1, "refunds %d of %d requests", rs.Requests, res.Requests)
	require.Positive(t, rs.Latency.P50)

	v, err := st.Check(ctx, res.Payments, res.RefundsSeen, res.ManualSeen)
	require.NoError(t, err)
	require.True(t, v.Correct, "%+v", v)
	require.Equal(t, len(res.RefundsSeen), v.RefundsChecked, "every refund answered was checked")

	// The same, read independently: kasa's database against the simulator's whole refund book.
	pool, err := pgxpool.New(ctx, st.DatabaseURL)
	require.NoError(t, err)
	defer pool.Close()
	var succeeded, settled, refundedSum, succeededSum int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status IN ('succeeded', 'failed')),
		coalesce(sum(amount_minor) FILTER (WHERE status = 'succeeded'), 0) FROM refunds`).Scan(&succeeded, &settled, &succeededSum))
	require.NoError(t, pool.QueryRow(ctx, `SELECT coalesce(sum(refunded_minor), 0) FROM payments`).Scan(&refundedSum))
	require.Equal(t, int64(len(res.RefundsSeen)), settled, "every refund finished")
	require.Equal(t, succeededSum, refundedSum, "payments' refunded amounts are their succeeded refunds")
	resp, err := http.Get(st.SimURL + "/_sim/refunds")
	require.NoError(t, err)
	defer resp.Body.Close()
	var bank struct {
		Count   int
		Pending int
		Refunds []struct {
			Reference string
			Status    string
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&bank))
	require.Equal(t, int(succeeded), bank.Count, "one refund at the bank per refund kasa has succeeded")
	require.Zero(t, bank.Pending)
	refs := map[string]int{}
	for _, r := range bank.Refunds {
		if r.Status == "succeeded" {
			refs[r.Reference]++
		}
	}
	require.Len(t, refs, int(succeeded), "each under its own reference")
	for ref := range refs {
		require.Contains(t, res.RefundsSeen, ref, "a refund the bench asked for")
	}
}
