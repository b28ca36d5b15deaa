package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStorePath runs the store-path mode briefly: payments go through kasa's store steps with the
// event pipeline running, P and M run beside them, every webhook is delivered, kasa verify is
// clean, and the report carries every figure.
func TestStorePath(t *testing.T) {
	rep, err := StorePath(context.Background(), StorePathOptions{Clients: 4, Duration: 2 * time.Second, Warmup: 500 * time.Millisecond,
		Merchants: []int{1, 10}, PGBench: true, Progress: t.Logf})
	require.NoError(t, err)
	require.Empty(t, rep.Problems)
	require.True(t, rep.Correct)
	require.Len(t, rep.Runs, 2)
	for i, n := range []int{1, 10} {
		r := rep.Runs[i]
		require.Equal(t, n, r.Merchants)
		require.Positive(t, r.Payments)
		require.Positive(t, r.Rate)
		require.Zero(t, r.Errors)
		require.Positive(t, r.P50MS)
		require.Positive(t, r.WALBytes)
		require.Positive(t, r.CPUMS[ClassKasa])
		require.Positive(t, r.CPUMS[ClassPostgres])
	}
	require.Positive(t, rep.PGBench["P"].TPS)
	require.Positive(t, rep.PGBench["M"].TPS)
	require.Positive(t, rep.PGBenchCPUMS["P"])
	require.Positive(t, rep.PGBenchCPUMS["M"])
	for _, k := range []string{"P/M", "P/M by PostgreSQL CPU", "store/P", "one/10"} {
		require.Positive(t, rep.Ratios[k], k)
	}
	require.Positive(t, rep.KasaCPUMS)
	for _, k := range []string{"store", "P", "M"} {
		require.NotEmpty(t, rep.Statements[k], k)
		require.Positive(t, rep.Statements[k][0].Calls, k)
	}
	require.Positive(t, rep.Statements["store"][0].PerPayment)
	require.GreaterOrEqual(t, rep.Webhooks, rep.Runs[0].Payments+rep.Runs[1].Payments)
	require.Positive(t, rep.BytesKept)
	require.Positive(t, rep.BytesWindowed)
	require.Zero(t, rep.Retained, "retention with a window of zero leaves no windowed row")
	md := StorePathMarkdown(rep)
	for _, s := range []string{"| store path | 1 |", "| store path | 10 |", "pgbench P", "pgbench M", "| P/M |", "| store/P |", "| one/10 |", "kasa's own CPU per payment", "Costliest statements, store path", "Costliest statements, pgbench P", "Bytes per payment", "kasa verify: clean"} {
		require.Contains(t, md, s)
	}
}
