package bench

import (
	_ "embed"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/kasa-pay/kasa/workflows"
)

// RunReport is one run that `kasa bench --out` keeps: what it measured and whether it was correct.
type RunReport struct {
	Header
	Run Result `json:"run"`
	Verdict
}

// Header opens every report but the store path's: when, where, what was measured, and how.
type Header struct {
	Started    time.Time `json:"started"`
	Machine    string    `json:"machine"`
	Commit     string    `json:"commit"`
	Capability string    `json:"provider_capability,omitempty"` // KASA_PROVIDER_CAPABILITY of the measured kasa
	Options    Options   `json:"options"`
}

//go:embed report.md.tmpl
var reportTemplates string

var reports = template.Must(template.New("").Funcs(template.FuncMap{
	"cell": cell, "inc": func(i int) int { return i + 1 },
	"f0": format("%.0f"), "f1": format("%.1f"), "f2": format("%.2f"),
	"round1":    func(v float64) float64 { return math.Round(v*10) / 10 }, // the suite's half rate is a quotient
	"div":       func(a, b float64) float64 { return a / b },
	"share":     func(n, of int64) string { return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(max(of, 1))) },
	"list":      func(s ...string) []string { return s },
	"results":   func(r ...Result) []Result { return r },
	"runs":      func(title string, runs []Result) runsView { return runsView{title, runs} },
	"ownTarget": func() float64 { return OwnTarget },
	"payday":    func() int { return PaydayFactor },
	"sum":       sum,
	// other is the CPU of the classes without a column of their own; never a rounding's -0.00.
	"other": func(m map[string]float64) float64 {
		return max(sum(m)-m[ClassKasa]-m[ClassPostgres]-m[ClassTemporal]-m[ClassBanksim]-m[ClassBench], 0)
	},
	"has": func(runs []Result, what string) bool { // whether a run has refunds, manual or cpu figures
		return slices.ContainsFunc(runs, func(r Result) bool {
			return map[string]bool{"refunds": r.Refunds != nil, "manual": r.Manual != nil, "cpu": r.CPU != nil}[what]
		})
	},
	// automatic is the run of automatic payments a suite's manual mix is set beside: its last
	// spread run, with the same merchants and options but the mix.
	"automatic": func(runs []Result) *Result {
		for i := len(runs) - 1; i >= 0; i-- {
			if strings.HasPrefix(runs[i].Path, RunSpread+" #") {
				return &runs[i]
			}
		}
		return nil
	},
	"problems": func(v Verdict) []string {
		return slices.Concat(v.Problems, v.RefundProblems, v.ManualProblems)
	},
	"counters": func(m map[string]float64) string {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m)) {
			parts = append(parts, fmt.Sprintf("%s %.1f", k, m[k]))
		}
		return strings.Join(parts, ", ")
	},
	"shapes": func() string { // the shape a payment has with each provider capability, which T copies
		var out []string
		for _, c := range workflows.Capabilities {
			out = append(out, fmt.Sprintf("`%s` %s", c, ShapeFor(c)))
		}
		return strings.Join(out, ", ")
	},
	"goal": func(t Target) string {
		if t.Name[0] == '5' || strings.Contains(t.Formula, "at most") { // an upper bound
			return fmt.Sprintf("≤ %.0f", t.Threshold)
		}
		return fmt.Sprintf("≥ %.2f", t.Threshold)
	},
	"pgbench": func(m map[string]PGBenchResult, k string) *PGBenchResult {
		if r, ok := m[k]; ok {
			return &r
		}
		return nil
	},
	"most": func(rep *StorePathReport) (n int) { // the largest merchant count of the runs
		for _, r := range rep.Runs {
			n = max(n, r.Merchants)
		}
		return n
	},
	"ratioGoal": func(k string) string {
		if strings.HasPrefix(k, "one/") {
			return "≥ 0.9"
		}
		return map[string]string{"P/M": "≥ 0.8", "store/P": "≥ 0.7", "P/M by PostgreSQL CPU": "(M's CPU per payment ÷ P's)"}[k]
	},
}).Parse(reportTemplates))

// render executes a template of report.md.tmpl. It fails only on a bug in a template, which
// the tests of every report would show: so it panics rather than burden every caller.
func render(name string, data any) string {
	var b strings.Builder
	if err := reports.ExecuteTemplate(&b, name, data); err != nil {
		panic(err)
	}
	return b.String()
}

// runsView is the template "runs": a summary table with one row per run, the answers of every
// run, the refunds of runs with a refund mix, the captures and cancels of runs with a manual
// mix, and what an operation of each run cost in CPU by process class.
type runsView struct {
	Title string
	Runs  []Result
}

// RunText is what `kasa bench` prints for one run: its Markdown and its counters per operation.
func RunText(res Result) string { return render("runtext", res) }

// SuiteMarkdown is a suite's report: verdict, targets with their inputs, runs, database ceilings.
func SuiteMarkdown(rep *Report) string { return render("suite", rep) }

// RunMarkdown is a kept run's report: its setting and verdict, then body (Markdown of the run).
func RunMarkdown(rep RunReport, body string) string {
	return render("run", struct {
		RunReport
		Body string
	}{rep, body})
}

// PaydayMarkdown is a payday run's report.
func PaydayMarkdown(p *Payday) string { return render("payday", p) }

// StorePathMarkdown is a store-path run's report.
func StorePathMarkdown(rep *StorePathReport) string { return render("storepath", rep) }

// cell keeps a value from breaking its table row.
func cell(s string) string { return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s) }

func format(f string) func(float64) string {
	return func(v float64) string { return fmt.Sprintf(f, v) }
}

func sum(m map[string]float64) (all float64) {
	for _, v := range m {
		all += v
	}
	return all
}
