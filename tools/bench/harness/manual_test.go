package harness

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/tools/banksim"
	"github.com/kasa-pay/kasa/tools/bench"
	"github.com/kasa-pay/kasa/tools/devenv"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// A run with a manual mix on a real kasa dev authorizes about the share asked of its new
// payments and captures or cancels them, never as kasa refuses; the check finds each at the bank
// simulator authorized once and captured as kasa says, with no charge, and kasa verify agrees.
func TestManualMixOnKasaDev(t *testing.T) {
	ctx := context.Background()
	cli, err := devenv.FindTemporalCLI()
	require.NoError(t, err)
	t.Setenv("KASA_TEMPORAL_CLI", cli)
	cfg := testConfig(testkit.KasaBinary(t))
	st, err := startStack(ctx, cfg, TemporalDev, TopologyDev, false)
	require.NoError(t, err)
	defer func() { st.stop(t.Failed()) }()

	o := bench.Options{APIURL: st.APIURL, AdminToken: st.AdminToken, Duration: 4 * time.Second, Warmup: time.Second,
		Concurrency: 4, Merchants: 3, Payers: 2, Duplicates: 0.05, Insufficient: 0.05, ManualShare: 0.3}
	fx, err := bench.Setup(ctx, o)
	require.NoError(t, err)
	res, err := bench.Run(ctx, o, fx)
	require.NoError(t, err)
	require.Zero(t, res.Errors, res.FirstError)
	ms := res.Manual
	require.NotNil(t, ms)
	require.Positive(t, ms.Captures, "%v", res.Answers)
	require.Positive(t, ms.Cancels, "%v", res.Answers)
	require.Positive(t, res.Answers["capture 201 succeeded"], "%v", res.Answers)
	require.Positive(t, res.Answers["cancel 200 canceled"], "%v", res.Answers)
	for label := range res.Answers {
		require.False(t, strings.Contains(label, "not_capturable") || strings.Contains(label, "not_cancelable") ||
			strings.Contains(label, "exceeds"), "a command kasa refused: %v", res.Answers)
	}
	require.InDelta(t, 0.3, float64(ms.Authorizations)/float64(res.NewPayments), 0.12, "%d of %d", ms.Authorizations, res.NewPayments)
	require.Positive(t, ms.Latency.P50)

	v, err := st.Check(ctx, res.Payments, res.RefundsSeen, res.ManualSeen)
	require.NoError(t, err)
	require.True(t, v.Correct, "%+v", v)
	require.Equal(t, len(res.ManualSeen), v.ManualChecked, "every manual payment answered was checked")

	// The same, read independently: kasa's database, and no charge at the bank for any of them.
	pool, err := pgxpool.New(ctx, st.DatabaseURL)
	require.NoError(t, err)
	defer pool.Close()
	var manual, captured int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'succeeded' AND captured_minor > 0)
		FROM payments WHERE capture_manual`).Scan(&manual, &captured))
	require.Equal(t, len(res.ManualSeen), manual, "every manual payment kasa made was seen")
	require.Positive(t, captured)
	bank := banksim.Control{URL: st.SimURL}
	for id := range res.ManualSeen {
		m, err := bank.Charges(ctx, id)
		require.NoError(t, err)
		require.Zero(t, m.Count, "a manual payment makes no charge: %s", id)
	}
}
