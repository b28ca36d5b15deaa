package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Comparison is kasa and ceiling T measured on several Temporal servers in one run, each side
// on a fresh stack: where a payment's cost goes as the server changes.
type Comparison struct {
	Started time.Time `json:"started"`
	Machine string    `json:"machine"`
	Commit  string    `json:"commit"`
	Options Options   `json:"options"`
	// Load is /proc/loadavg before and after each side: other work on the machine skews every figure.
	Load  []string `json:"loadavg"`
	Sides []Side   `json:"sides"`
}

// Side is one Temporal server's pair: T of the payment's shape and new payments, in two passes,
// the second in mirror order.
type Side struct {
	Temporal string   `json:"temporal"` // the side's name: "dev", "server", "server, split"
	About    string   `json:"about"`    // what that server is, and how kasa runs on it
	Shape    string   `json:"t_shape"`  // T's shape
	Runs     []Result `json:"runs"`
	// The passes' means: workflows/s of T, new payments/s of kasa, and their paired ratio.
	TRate, KasaRate, Ratio float64
	RatioInputs            string
	T, Kasa                Summary // the passes' means of latency, CPU and counters per operation
	Verdict
}

// Summary is the mean over a side's two passes of one kind of run.
type Summary struct {
	P50, P99 float64            // milliseconds
	CPU      map[string]float64 // CPU milliseconds per operation, by process class
	Cores    float64            // all classes together: cores busy on average
	PerOp    map[string]float64 // counters per operation
	Own      float64            // kasa's own CPU milliseconds per operation (OwnCPU)
}

// Side names the runs of a comparison.
const (
	CompareT    = RunTOwn
	CompareKasa = RunSpread
)

// SideOf is what a side measures: its name, what it is, and the shape of T beside kasa there.
type SideOf struct {
	Name, About string
	Shape       Shape
}

// SplitShape is the payment's shape when the process that starts it hosts no worker (kasa api
// beside kasa worker): the start cannot be eager, so the first workflow task goes through the
// server's matching to a poller.
var SplitShape = Shape{Steps: "LLLL", SearchAttributes: true}

// CompareSide measures one side on s: merchants from o, then T, kasa, kasa, T (two passes, each
// a pair of runs side by side), then the correctness check.
func CompareSide(ctx context.Context, s Stack, o Options, of SideOf) (Side, error) {
	temporal := of.Name
	side := Side{Temporal: temporal, About: of.About, Shape: of.Shape.String()}
	o.Progress("%s: setting up %d merchants", temporal, o.Merchants)
	fx, err := Setup(ctx, Options{APIURL: s.APIURL, AdminToken: s.AdminToken, Merchants: o.Merchants, Payers: 1})
	if err != nil {
		return side, err
	}
	if err := s.Settle(ctx); err != nil {
		return side, err
	}
	runs, payments, refunds := map[string]Result{}, map[string]string{}, map[string]RefundOf{}
	for _, name := range []string{CompareT + " #1", CompareKasa + " #1", CompareKasa + " #2", CompareT + " #2"} {
		opts := o
		opts.APIURL, opts.AdminToken, opts.CPU, opts.Counters = s.APIURL, s.AdminToken, s.CPU, s.Counters
		var r Result
		if strings.HasPrefix(name, CompareT) {
			r, err = WorkflowCeiling(ctx, s.Temporal, of.Shape, opts)
		} else {
			r, err = Run(ctx, opts, fx)
		}
		if err != nil {
			return side, fmt.Errorf("%s, %s: %w", temporal, name, err)
		}
		r.Path = temporal + ": " + name + " (" + r.Path + ")"
		runs[name] = r
		side.Runs = append(side.Runs, r)
		for id, status := range r.Payments {
			notePayment(payments, id, status)
		}
		maps.Copy(refunds, r.RefundsSeen)
		o.Progress("%-50s %8.1f new/s  p50 %7.1f ms  p99 %7.1f ms  errors %d", r.Path, r.NewPaymentRate, r.Latency.P50, r.Latency.P99, r.Errors)
	}
	side.Ratio, side.RatioInputs = paired(runs, CompareKasa, CompareT)
	side.T, side.TRate = summarizePair(runs[CompareT+" #1"], runs[CompareT+" #2"])
	side.Kasa, side.KasaRate = summarizePair(runs[CompareKasa+" #1"], runs[CompareKasa+" #2"])
	o.Progress("%s: checking the payments at the bank simulator and running kasa verify", temporal)
	side.Verdict, err = s.Check(ctx, payments, refunds)
	return side, err
}

// summarizePair is the mean of two runs of one kind, and their mean rate.
func summarizePair(a, b Result) (Summary, float64) {
	s := Summary{P50: (a.Latency.P50 + b.Latency.P50) / 2, P99: (a.Latency.P99 + b.Latency.P99) / 2,
		CPU: map[string]float64{}, PerOp: map[string]float64{}}
	for _, r := range []Result{a, b} {
		if r.CPU != nil {
			for class, ms := range r.CPU.MS {
				s.CPU[class] += ms / 2
			}
			s.Cores += r.CPU.Cores / 2
			s.Own += r.CPU.Own.MS / 2
		}
		for name, n := range r.PerOp {
			s.PerOp[name] += n / 2
		}
	}
	return s, (rate(a) + rate(b)) / 2
}

// CompareMarkdown is a comparison's report: one row per side, CPU and database work per
// operation, then every run.
func CompareMarkdown(c *Comparison) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# kasa and ceiling T on the Temporal dev server and on a real Temporal Server, %s\n\n",
		c.Started.Format("2006-01-02 15:04 UTC"))
	var shapes []string
	for _, s := range c.Sides {
		shapes = append(shapes, s.Temporal+": "+s.Shape)
	}
	fmt.Fprintf(&b, "Machine: %s. Commit: %s. Each run: %s measured after %s of warm-up, %d clients, %d merchants; "+
		"per side T, kasa, kasa, T (two passes, the second mirrored). T: workflows with no-op steps of the shape kasa's payment has on that side (%s). "+
		"Load average (1, 5, 15 min) before and after each side: %s.\n\n",
		c.Machine, c.Commit, c.Options.Duration, c.Options.Warmup, c.Options.Concurrency, c.Options.Merchants,
		strings.Join(shapes, "; "), strings.Join(c.Load, "; "))
	b.WriteString("| side | T workflows/s | kasa new payments/s | kasa ÷ T | T p50 / p99 ms | kasa p50 / p99 ms | correct |\n|---|---:|---:|---:|---:|---:|---|\n")
	for _, s := range c.Sides {
		fmt.Fprintf(&b, "| %s: %s | %.1f | %.1f | %.2f | %.1f / %.1f | %.1f / %.1f | %s |\n", cell(s.Temporal), cell(s.About), s.TRate, s.KasaRate, s.Ratio,
			s.T.P50, s.T.P99, s.Kasa.P50, s.Kasa.P99, map[bool]string{true: "yes", false: "**NO**"}[s.Correct])
	}
	b.WriteString("\nCPU milliseconds per workflow (T) or new payment (kasa), by process:\n\n")
	b.WriteString("| side | run | kasa | temporal | postgres | bench | all | cores busy | kasa's own (kasa + its part of postgres) | own ÷ temporal |\n" +
		"|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range c.Sides {
		for _, row := range []struct {
			name string
			sum  Summary
		}{{"T", s.T}, {"kasa", s.Kasa}} {
			all := 0.0
			for _, ms := range row.sum.CPU {
				all += ms
			}
			m := row.sum.CPU
			ratio := "-"
			if t := m[ClassTemporal]; t > 0 && row.name == "kasa" {
				ratio = fmt.Sprintf("%.2f (target ≤ %.1f)", row.sum.Own/t, OwnTarget)
			}
			fmt.Fprintf(&b, "| %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", cell(s.Temporal), row.name,
				m[ClassKasa], m[ClassTemporal], m[ClassPostgres], m[ClassBench], all, row.sum.Cores, row.sum.Own, ratio)
		}
	}
	b.WriteString(dbMarkdown(c.Sides))
	b.WriteString("\nRatio inputs (each pass's pair ran side by side):\n\n")
	for _, s := range c.Sides {
		fmt.Fprintf(&b, "- %s: %s; %d payments checked, %d double charges, %d invariant violations\n",
			s.Temporal, s.RatioInputs, s.Checked, s.Doubles, len(s.Problems))
	}
	b.WriteString("\n")
	var runs []Result
	for _, s := range c.Sides {
		runs = append(runs, s.Runs...)
	}
	b.WriteString(Markdown("Runs", runs...))
	for _, s := range c.Sides {
		for _, r := range s.Runs {
			if len(r.PerOp) > 0 {
				fmt.Fprintf(&b, "\n%s, counters per operation: ", cell(r.Path))
				for i, n := range slices.Sorted(maps.Keys(r.PerOp)) {
					fmt.Fprintf(&b, "%s%s %.1f", map[bool]string{true: "", false: ", "}[i == 0], n, r.PerOp[n])
				}
				b.WriteString("\n")
			}
		}
	}
	return b.String()
}

// dbMarkdown is the database work per operation of each side's runs, by database: commits
// (pg_stat_database.xact_commit, read-only transactions included), statements other than
// transaction control and the WAL they wrote (pg_stat_statements, where loaded), rows written;
// and the cluster's whole WAL, of which what no statement wrote (commit records, autovacuum,
// checkpoint records) is in no database's share.
func dbMarkdown(sides []Side) string {
	var b strings.Builder
	b.WriteString("\nDatabase work per workflow (T) or new payment (kasa): each counter's growth over the measured window ÷ operations. " +
		"Commits: `pg_stat_database.xact_commit`, read-only transactions included. Statements: executions other than " +
		"BEGIN/COMMIT/ROLLBACK/SAVEPOINT (`pg_stat_statements.calls`), and WAL bytes by statements: `pg_stat_statements.wal_bytes`, " +
		"and the pages they wrote whole (`wal_fpi`: the first change to a page after a checkpoint; the bench checkpoints before each side's runs), " +
		"where the bench started PostgreSQL with pg_stat_statements (the real server's sides; - where not). " +
		"WAL bytes, whole cluster: `pg_current_wal_lsn()`; what no statement wrote (commit records, autovacuum, checkpoint records) is in no database's share; a statement's full-page images are in its own.\n\n")
	b.WriteString("| side | run | database | commits | statements | rows written | WAL bytes by statements | full-page images |\n|---|---|---|---:|---:|---:|---:|---:|\n")
	num := func(m map[string]float64, k string, f string) string {
		if v, ok := m[k]; ok {
			return fmt.Sprintf(f, v)
		}
		return "-"
	}
	for _, s := range sides {
		for _, row := range []struct {
			name string
			sum  Summary
		}{{"T", s.T}, {"kasa", s.Kasa}} {
			m := row.sum.PerOp
			if len(m) == 0 {
				continue
			}
			byStatements, counted := 0.0, false
			for _, db := range []string{"temporal", "temporal_visibility", "kasa"} {
				if _, ok := m["commits "+db]; !ok {
					continue
				}
				v, ok := m["wal bytes "+db]
				byStatements, counted = byStatements+v, counted || ok
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", cell(s.Temporal), row.name, db,
					num(m, "commits "+db, "%.1f"), num(m, "statements "+db, "%.1f"), num(m, "rows written "+db, "%.1f"),
					num(m, "wal bytes "+db, "%.0f"), num(m, "full-page images "+db, "%.2f"))
			}
			if all, ok := m["wal bytes, all"]; ok {
				wal := fmt.Sprintf("%.0f", all)
				if counted {
					wal += fmt.Sprintf(" (%.0f in no statement)", all-byStatements)
				}
				fmt.Fprintf(&b, "| %s | %s | whole cluster | | | | %s | %s |\n", cell(s.Temporal), row.name, wal, num(m, "full-page images, all", "%.2f"))
			}
		}
	}
	return b.String()
}
