package bench

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kasa-pay/kasa/workflows"
)

// WriteMarkdown writes a summary table with one row per run, the answers of every run, and what an
// operation of each run cost in CPU by process class, if any run measured it.
func WriteMarkdown(w io.Writer, title string, runs ...Result) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "## %s\n\n| # | path | mode | clients | rate/s | merchants | s | requests | req/s | new payments/s | p50 ms | p90 ms | p95 ms | p99 ms | max ms | errors | unsent |\n", title)
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, r := range runs {
		rate := "-"
		if r.Rate > 0 {
			rate = strconv.FormatFloat(math.Round(r.Rate*10)/10, 'f', -1, 64) // the suite's half rate is a quotient
		}
		l := r.Latency
		fmt.Fprintf(&b, "| %d | %s | %s | %d | %s | %d | %.1f | %d | %.1f | %.1f | %.2f | %.2f | %.2f | %.2f | %.2f | %d | %d |\n",
			i+1, cell(r.Path), r.Mode, r.Concurrency, rate, r.Merchants, r.Duration, r.Requests, r.Throughput,
			r.NewPaymentRate, l.P50, l.P90, l.P95, l.P99, l.Max, r.Errors, r.Unsent)
	}
	b.WriteString("\n| # | answer | count | share |\n|---|---|---:|---:|\n")
	for i, r := range runs {
		for _, k := range slices.Sorted(maps.Keys(r.Answers)) {
			fmt.Fprintf(&b, "| %d | %s | %d | %.1f%% |\n", i+1, cell(k), r.Answers[k], 100*float64(r.Answers[k])/float64(max(r.Requests, 1)))
		}
		if r.Errors > 0 {
			fmt.Fprintf(&b, "| %d | transport error: %s | %d | |\n", i+1, cell(r.FirstError), r.Errors)
		}
	}
	if slices.ContainsFunc(runs, func(r Result) bool { return r.CPU != nil }) {
		b.WriteString("\nCPU per operation, in milliseconds, over each run's measured window (kasa: the measured `kasa dev`; bench: the load generator, and T's worker in T runs):\n\n")
		b.WriteString("| # | per | kasa | postgres | temporal | bench | other | all | cores busy |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	}
	for i, r := range runs {
		if r.CPU == nil {
			continue
		}
		m, all := r.CPU.MS, 0.0
		for _, ms := range m {
			all += ms
		}
		other := all - m[ClassKasa] - m[ClassPostgres] - m[ClassTemporal] - m[ClassBench]
		fmt.Fprintf(&b, "| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n",
			i+1, r.CPU.Per, m[ClassKasa], m[ClassPostgres], m[ClassTemporal], m[ClassBench], other, all, r.CPU.Cores)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// cell keeps a value from breaking its table row.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// CapabilityLine names the provider capability a suite ran with and the workflow shape a new
// payment runs with each capability (ShapeFor): the shape ceiling T copies. Empty when the report
// records no capability.
func (rep *Report) CapabilityLine() string {
	if rep.Capability == "" {
		return ""
	}
	parts := make([]string, len(workflows.Capabilities))
	for i, c := range workflows.Capabilities {
		parts[i] = fmt.Sprintf("`%s` %s", c, ShapeFor(c))
	}
	return fmt.Sprintf("Provider capability: %s. kasa's workflow shape for a payment that succeeds at its first charge, by provider capability: %s.\n\n",
		rep.Capability, strings.Join(parts, ", "))
}

// WriteSuiteMarkdown writes a suite's report: verdict, targets with their inputs, every run, the
// database ceilings.
func WriteSuiteMarkdown(w io.Writer, rep *Report) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# kasa bench, %s\n\nMachine: %s. Commit: %s. Each run: %s measured after %s of warm-up, %d clients.\n\n%s",
		rep.Started.Format("2006-01-02 15:04 UTC"), rep.Machine, rep.Commit, rep.Options.Duration, rep.Options.Warmup, rep.Options.Concurrency, rep.CapabilityLine())
	verdict := "**correct**: no payment was charged twice and `kasa verify` found no problem"
	if !rep.Correct {
		verdict = fmt.Sprintf("**FAILED**: %d double charge(s), %d invariant violation(s)", rep.Doubles, len(rep.Problems))
	}
	fmt.Fprintf(&b, "Correctness: %s (%d payments checked at the bank simulator).\n\n", verdict, rep.Checked)
	for _, p := range rep.Problems {
		fmt.Fprintf(&b, "- %s\n", cell(p))
	}
	b.WriteString("## Targets\n\n| target | formula | inputs | ratio | goal | met |\n|---|---|---|---:|---:|---|\n")
	for _, t := range rep.Targets {
		goal, met := fmt.Sprintf("≥ %.2f", t.Threshold), map[bool]string{true: "yes", false: "no"}[t.Met]
		if t.Name[0] == '5' {
			goal = fmt.Sprintf("≤ %.0f", t.Threshold)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f | %s | %s |\n", cell(t.Name), cell(t.Formula), cell(t.Inputs), t.Value, goal, met)
	}
	b.WriteString("\n")
	if err := WriteMarkdown(&b, "Runs", rep.Runs...); err != nil {
		return err
	}
	b.WriteString("\n## Database ceilings (pgbench, same PostgreSQL, same client count)\n\n| script | clients | tps | avg ms | p50 ms | p99 ms | failed |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, name := range slices.Sorted(maps.Keys(rep.PGBench)) {
		r := rep.PGBench[name]
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.2f | %.2f | %.2f | %d |\n", name, r.Clients, r.TPS, r.LatencyAvgMS, r.P50MS, r.P99MS, r.Failed)
	}
	_, err := w.Write(b.Bytes())
	return err
}
