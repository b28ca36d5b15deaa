package bench

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/kasa-pay/kasa/workflows"
)

// CapabilityLine names the provider capability a suite ran with and the workflow shape a new
// payment runs with each capability (ShapeFor): the shape ceiling T copies. Empty when
// the report records no capability.
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

// WriteSuiteMarkdown writes a suite's report: verdict, targets with their inputs, every run,
// the database ceilings and the table sizes.
func WriteSuiteMarkdown(w io.Writer, rep *Report) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# kasa bench, %s\n\n", rep.Started.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Machine: %s. Commit: %s. Each run: %s measured after %s of warm-up, %d clients.\n\n",
		rep.Machine, rep.Commit, rep.Options.Duration, rep.Options.Warmup, rep.Options.Concurrency)
	b.WriteString(rep.CapabilityLine())
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
		goal, met := fmt.Sprintf("≥ %.2f", t.Threshold), "no"
		if t.Name[0] == '5' {
			goal = fmt.Sprintf("≤ %.0f", t.Threshold)
		}
		if t.Met {
			met = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.2f | %s | %s |\n", cell(t.Name), cell(t.Formula), cell(t.Inputs), t.Value, goal, met)
	}
	b.WriteString("\n")
	var slow []string
	for i, sp := range machineSpeeds(rep.Runs) {
		if sp > 0 && sp < 0.8 {
			slow = append(slow, fmt.Sprintf("#%d (%.0f%%)", i+1, 100*sp))
		}
	}
	if len(slow) > 0 {
		fmt.Fprintf(&b, "**The machine was slow during some runs**, by a CPU probe taken just before each run (share of the fastest probe): %s. "+
			"A ratio between a run in a slow spell and one outside it measures the machine, not kasa.\n\n", strings.Join(slow, ", "))
	}
	if err := WriteMarkdown(&b, "Runs", rep.Runs...); err != nil {
		return err
	}

	b.WriteString("\n## Database ceilings (pgbench, same PostgreSQL, same client count)\n\n| script | clients | tps | avg ms | p50 ms | p99 ms | failed |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, name := range slices.Sorted(maps.Keys(rep.PGBench)) {
		r := rep.PGBench[name]
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.2f | %.2f | %.2f | %d |\n", name, r.Clients, r.TPS, r.LatencyAvgMS, r.P50MS, r.P99MS, r.Failed)
	}
	if len(rep.Sizes) > 0 {
		b.WriteString("\n## Tables\n\n| table | rows | table bytes | index bytes | bytes/row (table + indexes) |\n|---|---:|---:|---:|---:|\n")
		for _, s := range rep.Sizes {
			per := "-"
			if s.Rows > 0 {
				per = fmt.Sprintf("%.0f", float64(s.TableBytes+s.IndexBytes)/float64(s.Rows))
			}
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %s |\n", s.Table, s.Rows, s.TableBytes, s.IndexBytes, per)
		}
	}
	_, err := w.Write(b.Bytes())
	return err
}
