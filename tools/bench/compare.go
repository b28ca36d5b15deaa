package bench

import (
	"context"
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
	// Load is the load average before and after each side: other work on the machine skews every figure.
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

// CompareSide measures one side on s: merchants from o, then T, kasa, kasa, T (two passes, each
// a pair of runs side by side), then the correctness check.
func CompareSide(ctx context.Context, s Stack, o Options, of SideOf) (Side, error) {
	side := Side{Temporal: of.Name, About: of.About, Shape: of.Shape.String()}
	o.Progress("%s: setting up %d merchants", of.Name, o.Merchants)
	fx, err := Setup(ctx, Options{APIURL: s.APIURL, AdminToken: s.AdminToken, Merchants: o.Merchants, Payers: 1})
	if err != nil {
		return side, err
	}
	if err := s.Settle(ctx); err != nil {
		return side, err
	}
	ss := newSession(s, o, of.Name+": ")
	opts := o
	opts.Counters = s.Counters
	for _, name := range []string{CompareT + " #1", CompareKasa + " #1", CompareKasa + " #2", CompareT + " #2"} {
		st := step{name: name, opts: opts, fx: fx}
		if strings.HasPrefix(name, CompareT) {
			st.shape = &of.Shape
		}
		if _, err := ss.run(ctx, st); err != nil {
			return side, err
		}
	}
	side.Runs = ss.runs
	side.Ratio, side.RatioInputs = paired(ss.byName, CompareKasa, CompareT)
	side.T, side.TRate = summarizePair(ss.byName[CompareT+" #1"], ss.byName[CompareT+" #2"])
	side.Kasa, side.KasaRate = summarizePair(ss.byName[CompareKasa+" #1"], ss.byName[CompareKasa+" #2"])
	o.Progress("%s: checking the payments at the bank simulator and running kasa verify", of.Name)
	side.Verdict, err = s.Check(ctx, ss.payments, ss.refunds, ss.manual)
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
