package bench

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Markdown is the template "runs" of runs under a title.
func Markdown(title string, runs ...Result) string { return render("runs", runsView{title, runs}) }

func sampleResult(path string, seconds int) Result {
	return Result{
		Path: path, Mode: "open", Concurrency: 64, Rate: 200, Merchants: 10, Duration: float64(seconds),
		Requests: 1000, Errors: 3, FirstError: "dial tcp: connection refused | twice\nthen", Throughput: 100, NewPayments: 900, NewPaymentRate: 90,
		Latency: Latency{P50: 12.5, P90: 30, P95: 41, P99: 80.25, Max: 400},
		Answers: map[string]int64{"201 succeeded": 800, "402 insufficient_funds": 100, "201 replayed": 100},
	}
}

func TestMarkdown(t *testing.T) {
	t.Parallel()
	require.NotContains(t, Markdown("kasa bench", sampleResult("payments", 10), sampleResult("/a|b", 3)), "CPU per operation", "no CPU table without a measurement")
	measured := sampleResult("payments", 10)
	measured.CPU = &CPUUse{Per: "new payment", MS: map[string]float64{ClassKasa: 4.5, ClassPostgres: 3.25, ClassTemporal: 11, ClassBanksim: 0.5, ClassBench: 0.3, "sh": 0.1, "yes": 0.05}, Cores: 1.8,
		Own: OwnCPU{MS: 7.5, Postgres: 3, Ratio: 7.5 / 11, Target: OwnTarget}}
	out := Markdown("kasa bench", sampleResult("/a|b", 3), measured)
	require.Contains(t, out, "| 2 | new payment | 4.50 | 3.25 | 3.00 | 11.00 | 0.50 | 0.30 | 0.15 | 19.70 | 1.80 | **7.50** | 0.68 (**not met**) |",
		"other sums the unnamed classes; kasa's own and its ratio to Temporal's, against the target")
	require.Contains(t, out, "target ≤ 0.5")
	require.NotContains(t, out, "| 1 | new payment |", "a run without a measurement has no CPU row")
	require.True(t, strings.HasPrefix(out, "## kasa bench\n"))
	require.Contains(t, out, "| 402 insufficient_funds | 100 | 10.0% |")
	require.Contains(t, out, "| open | 64 | 200 | 10 |")
	third := sampleResult("payments", 10)
	third.Rate = 100.0 / 3
	require.Contains(t, Markdown("kasa bench", third), "| open | 64 | 33.3 | 10 |", "a rate is shown to one decimal")
	// Every row of a table has as many cell separators as its header (escaped pipes aside).
	for _, table := range strings.Split(out, "\n\n")[1:] {
		lines := strings.Split(strings.TrimSpace(table), "\n")
		if !strings.HasPrefix(lines[0], "|") {
			continue // a table's caption
		}
		require.GreaterOrEqual(t, len(lines), 3)
		want := strings.Count(lines[0], "|")
		for _, l := range lines {
			require.True(t, strings.HasPrefix(l, "|") && strings.HasSuffix(l, "|"), l)
			require.Equal(t, want, strings.Count(l, "|")-strings.Count(l, `\|`), l)
		}
	}
}

func TestSuiteReportNamesTheCapability(t *testing.T) {
	t.Parallel()
	rep := &Report{Verdict: Verdict{Correct: true}, Runs: []Result{sampleResult("run", 2)}}
	require.NotContains(t, SuiteMarkdown(rep), "Provider capability", "no capability recorded, none claimed")

	rep.Capability = "none"
	require.Contains(t, SuiteMarkdown(rep), "Provider capability: none. kasa's workflow shape for a payment that succeeds at its first charge, by provider capability: "+
		"`idempotent` LLLL+eager+search-attributes, `inquiry` LLLL+eager+search-attributes, `none` LLLL+eager+search-attributes.")
}
