package bench

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
)

// Stack is a running kasa to measure, and what the suite needs to reach around it.
type Stack struct {
	APIURL, SimURL, AdminToken, DatabaseURL string
	Temporal                                client.Client
	Verify                                  func(ctx context.Context) ([]string, error)         // kasa verify: the invariant violations
	Preload                                 func(ctx context.Context, fx *Fixture, n int) error // n finished payments for fx's merchants
	Settle                                  func(ctx context.Context) error                     // vacuum, analyze and checkpoint
	CPU                                     CPU                                                 // if set, each run reports its CPU by process class
	Counters                                Counters                                            // if set, each run reports their growth per operation
	Backlog                                 Backlog                                             // the start backlog, for the payday run
}

// Report is one suite run: every measurement, the ratios the targets ask for, and its verdict.
type Report struct {
	Header
	Runs    []Result                 `json:"runs"` // in the order run; most twice (passes #1 and #2), see targets
	PGBench map[string]PGBenchResult `json:"pgbench"`
	Targets []Target                 `json:"targets"`
	Verdict
}

// Verdict says whether runs were correct: a run that charged a payment twice or broke an
// invariant failed, whatever its speed.
type Verdict struct {
	Checked  int      `json:"payments_checked"` // payments whose charges were counted at the simulator
	Doubles  int      `json:"double_charges"`
	Problems []string `json:"verify_problems"` // kasa verify's
	// Refunds checked at the bank simulator and against their payments (checkRefunds), those
	// refunded more than once there, and every mismatch found.
	RefundsChecked int      `json:"refunds_checked"`
	RefundDoubles  int      `json:"double_refunds"`
	RefundProblems []string `json:"refund_problems,omitempty"`
	// Manual payments checked at the bank simulator and against kasa (checkManual), those with
	// more than one authorization there, and every mismatch found.
	ManualChecked        int      `json:"manual_checked"`
	DoubleAuthorizations int      `json:"double_authorizations"`
	ManualProblems       []string `json:"manual_problems,omitempty"`
	Correct              bool     `json:"correct"`
}

// Target is one of the benchmark's goals, a ratio of measurements, with its inputs.
type Target struct {
	Name      string  `json:"name"`
	Formula   string  `json:"formula"`
	Value     float64 `json:"value"`
	Threshold float64 `json:"threshold"`
	Met       bool    `json:"met"`
	Inputs    string  `json:"inputs"`
}

// Run names, in the order the suite runs them.
const (
	RunHTTP        = "H: GET /healthz"
	RunTOwn        = "T: payment shape"
	RunTLean       = "T: leanest shape"
	RunSpread      = "payments, spread"
	RunHot         = "payments, one merchant"
	RunReplay      = "replays"
	RunOpenHalf    = "payments, open loop at half the max"
	RunReplayLarge = "replays, large table"
	RunSpreadLarge = "payments, large table"
	RunTLarge      = "T: payment shape, beside the large table"
	RunHLarge      = "H: GET /healthz, beside the large table"
	RunRefundMix   = "payments with refunds"
	RunManualMix   = "payments with manual capture"
)

// The shares of RunRefundMix and RunManualMix when Options sets none. Real refunds are a few
// percent of payments, too few in a 15 s window for a p99: a fifth gives ~200 refunds (four
// quarters of each payment keep the run supplied), and a few hundred captures and cancels.
const SuiteRefundShare, SuiteManualShare = 0.2, 0.2

// Check counts at the bank simulator the charges of every payment that may have moved money (any
// not failed; only a count above one fails it, so a manual payment's none passes), checks the
// refunds (checkRefunds) and the manual payments (checkManual), and runs kasa verify.
func (s Stack) Check(ctx context.Context, payments map[string]string, refunds map[string]RefundOf, manual map[string]ManualOf) (v Verdict, err error) {
	var ids []string
	for id, status := range payments {
		if status != "failed" {
			ids = append(ids, id)
		}
	}
	if v.Doubles, err = CheckCharges(ctx, s.SimURL, ids); err != nil {
		return v, fmt.Errorf("check charges: %w", err)
	}
	if err := checkRefunds(ctx, s.APIURL, s.SimURL, refunds, 100, &v); err != nil {
		return v, fmt.Errorf("check refunds: %w", err)
	}
	if err := checkManual(ctx, s.APIURL, s.SimURL, manual, settleWait, &v); err != nil {
		return v, fmt.Errorf("check manual payments: %w", err)
	}
	if v.Problems, err = s.Verify(ctx); err != nil {
		return v, fmt.Errorf("verify: %w", err)
	}
	v.Checked = len(ids)
	v.Correct = v.Doubles+v.RefundDoubles+v.DoubleAuthorizations == 0 && len(slices.Concat(v.Problems, v.RefundProblems, v.ManualProblems)) == 0
	return v, nil
}

// step is one run: ceiling T of a shape, or a load run with opts against fx.
type step struct {
	name  string
	shape *Shape
	opts  Options
	fx    *Fixture
}

// session runs steps on a stack, named with prefix, and keeps every run and every payment,
// refund and manual payment answered, for the check.
type session struct {
	s        Stack
	o        Options // Warmup, and the Duration and Concurrency of steps that set none
	prefix   string
	runs     []Result
	byName   map[string]Result
	payments map[string]string
	refunds  map[string]RefundOf
	manual   map[string]ManualOf
}

func newSession(s Stack, o Options, prefix string) *session {
	return &session{s: s, o: o, prefix: prefix, byName: map[string]Result{}, payments: map[string]string{},
		refunds: map[string]RefundOf{}, manual: map[string]ManualOf{}}
}

func (ss *session) run(ctx context.Context, st step) (r Result, err error) {
	opts := st.opts
	opts.APIURL, opts.AdminToken, opts.CPU, opts.Warmup = ss.s.APIURL, ss.s.AdminToken, ss.s.CPU, ss.o.Warmup
	opts.Duration, opts.Concurrency = orDefault(opts.Duration, ss.o.Duration), orDefault(opts.Concurrency, ss.o.Concurrency)
	if st.shape != nil {
		r, err = WorkflowCeiling(ctx, ss.s.Temporal, *st.shape, opts)
	} else {
		r, err = Run(ctx, opts, st.fx)
	}
	if err != nil {
		return r, fmt.Errorf("%s%s: %w", ss.prefix, st.name, err)
	}
	r.Path = ss.prefix + st.name + " (" + r.Path + ")"
	ss.runs, ss.byName[st.name] = append(ss.runs, r), r
	for id, status := range r.Payments {
		notePayment(ss.payments, id, status)
	}
	maps.Copy(ss.refunds, r.RefundsSeen)
	maps.Copy(ss.manual, r.ManualSeen)
	ss.o.Progress("%-40s %8.1f req/s  %8.1f new/s  p50 %7.1f ms  p99 %7.1f ms  errors %d",
		ss.prefix+st.name, r.Throughput, r.NewPaymentRate, r.Latency.P50, r.Latency.P99, r.Errors)
	if rs := r.Refunds; rs != nil {
		ss.o.Progress("%-40s %8.1f refunds/s beside %.1f new payments/s  refund p50 %7.1f ms  p99 %7.1f ms",
			"", rs.Rate, r.NewPaymentRate, rs.Latency.P50, rs.Latency.P99)
	}
	if ms := r.Manual; ms != nil {
		ss.o.Progress("%-40s %8.1f captures/s  %6.1f cancels/s  command p50 %7.1f ms  p99 %7.1f ms",
			"", ms.CaptureRate, ms.CancelRate, ms.Latency.P50, ms.Latency.P99)
	}
	return r, nil
}

// RunSuite runs the standard suite against s, shaped by o (Merchants: of the spread load; the
// shares: of their mix's run only, by default SuiteRefundShare and SuiteManualShare).
func RunSuite(ctx context.Context, s Stack, o Options) (*Report, error) {
	rep := &Report{Header: Header{Started: time.Now().UTC(), Options: o}, PGBench: map[string]PGBenchResult{}}
	ss := newSession(s, o, "")
	// pass runs its steps in order or mirrored, after settling the database if asked, so that
	// a measurement does not pay for the writes before it. After a failure (err), a pass does nothing.
	var err error
	pass := func(settle, mirrored bool, steps ...step) {
		if settle && err == nil {
			err = s.Settle(ctx)
		}
		if mirrored {
			slices.Reverse(steps)
		}
		for _, st := range steps {
			if err == nil {
				_, err = ss.run(ctx, st)
			}
		}
	}
	// Ceiling T of the leanest shape runs before and after the payment runs, and the higher of the
	// two counts: a ceiling measured during someone else's load would flatter every ratio.
	if pass(false, false, step{name: RunTLean + " #1", shape: &LeanestShape}); err != nil {
		return nil, err
	}
	o.Progress("setting up %d merchants (spread) and 1 merchant (hot)", o.Merchants)
	spread, err := Setup(ctx, Options{APIURL: s.APIURL, AdminToken: s.AdminToken, Merchants: o.Merchants, Payers: 1})
	if err != nil {
		return nil, err
	}
	hot, err := Setup(ctx, Options{APIURL: s.APIURL, AdminToken: s.AdminToken, Merchants: 1, Payers: 100})
	if err != nil {
		return nil, err
	}
	payOpts := Options{Duplicates: o.Duplicates, Insufficient: o.Insufficient}
	// The targets compare runs that ran side by side: the machine's speed drifts by tens of percent
	// over minutes here. So a pass runs T, payments with many merchants, with one, replays and H
	// one after the other, and the second pass mirrors the order, weighing a drift alike on both sides.
	kasaRuns := func(p string) []step {
		return []step{{name: RunTOwn + p, shape: &PaymentShape}, {name: RunSpread + p, opts: payOpts, fx: spread},
			{name: RunHot + p, opts: payOpts, fx: hot}, {name: RunReplay + p, opts: Options{Path: "replay"}, fx: hot},
			{name: RunHTTP + p, opts: Options{Path: "/healthz"}}}
	}
	if pass(true, false, kasaRuns(" #1")...); err != nil {
		return nil, err
	}
	for _, script := range []string{PGBenchPayment, PGBenchReplay} {
		// Shorter than the other runs: no target divides by P, and R is far above H.
		r, err := PGBench(ctx, PGBenchOptions{DatabaseURL: s.DatabaseURL, Clients: o.Concurrency, Duration: min(o.Duration, 10*time.Second), Script: script, Rows: 10_000})
		if err != nil {
			return nil, fmt.Errorf("pgbench %s: %w", script, err)
		}
		rep.PGBench[script] = r
		o.Progress("%-40s %8.1f tps  p50 %7.2f ms  p99 %7.2f ms", "pgbench "+script, r.TPS, r.P50MS, r.P99MS)
	}
	// Half the maximum sustained rate, open loop: latency without coordinated omission, three
	// times as long as the other runs, as at half the rate a p99 needs the samples.
	half := Options{Rate: max(ss.byName[RunSpread+" #1"].NewPaymentRate/2, 1), Concurrency: 256, Insufficient: o.Insufficient, Duration: 3 * o.Duration}
	pass(true, false, step{name: RunOpenHalf, opts: half, fx: spread})
	pass(true, true, kasaRuns(" #2")...)
	pass(false, false, step{name: RunTLean + " #2", shape: &LeanestShape})
	// Refunds beside new payments: after the paired passes, so that no target's runs or their
	// neighbours change; no target divides by it.
	mix := Options{Duplicates: o.Duplicates, Insufficient: o.Insufficient, RefundShare: cmp.Or(o.RefundShare, SuiteRefundShare)}
	pass(true, false, step{name: RunRefundMix, opts: mix, fx: spread})
	// Manual capture beside them likewise: the report sets it beside the last spread run.
	mix = Options{Duplicates: o.Duplicates, Insufficient: o.Insufficient, ManualShare: cmp.Or(o.ManualShare, SuiteManualShare)}
	if pass(true, false, step{name: RunManualMix, opts: mix, fx: spread}); err != nil {
		return nil, err
	}
	byName := ss.byName
	for _, name := range []string{RunHTTP, RunTLean, RunSpread, RunReplay} { // the faster pass counts
		byName[name] = slices.MaxFunc([]Result{byName[name+" #1"], byName[name+" #2"]}, func(a, b Result) int { return cmp.Compare(rate(a), rate(b)) })
	}
	if o.Preload > 0 {
		o.Progress("preloading %d payments with their idempotency records", o.Preload)
		if err := s.Preload(ctx, spread, o.Preload); err != nil {
			return nil, fmt.Errorf("preload: %w", err)
		}
		// Each side is taken relative to a run beside it (new payments to T, replays to H), in
		// mirrored passes; these T and H runs are shorter: they only read the machine's pace.
		for _, p := range []string{" #1", " #2"} {
			pass(true, p == " #2", step{name: RunTLarge + p, shape: &PaymentShape, opts: Options{Duration: max(o.Duration/2, time.Second)}},
				step{name: RunSpreadLarge + p, opts: payOpts, fx: spread}, step{name: RunReplayLarge + p, opts: Options{Path: "replay"}, fx: hot},
				step{name: RunHLarge + p, opts: Options{Path: "/healthz", Duration: max(o.Duration/3, time.Second)}})
		}
		if err != nil {
			return nil, err
		}
	}
	o.Progress("checking the payments at the bank simulator and running kasa verify")
	if rep.Verdict, err = s.Check(ctx, ss.payments, ss.refunds, ss.manual); err != nil {
		return nil, err
	}
	rep.Runs, rep.Targets = ss.runs, targets(byName, rep.PGBench)
	return rep, nil
}

// rate is how fast a run went: new payments per second for payment runs, else requests per second.
func rate(r Result) float64 {
	if r.NewPaymentRate > 0 {
		return r.NewPaymentRate
	}
	return r.Throughput
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// paired divides run num by run den of the same pass, which ran side by side, and averages the two
// passes' ratios: the mirrored second pass makes a steady drift of the machine weigh alike on both.
func paired(runs map[string]Result, num, den string) (value float64, inputs string) {
	var parts []string
	for _, pass := range []string{" #1", " #2"} {
		n, d := rate(runs[num+pass]), rate(runs[den+pass])
		value += ratio(n, d) / 2
		parts = append(parts, fmt.Sprintf("%.1f ÷ %.1f = %.2f", n, d, ratio(n, d)))
	}
	return value, "mean of " + strings.Join(parts, " and ")
}

// targets computes the goals' ratios from one suite's measurements.
func targets(runs map[string]Result, pg map[string]PGBenchResult) []Target {
	spread, tLean, replay, h, r, open := runs[RunSpread], runs[RunTLean], runs[RunReplay], runs[RunHTTP], pg["replay"], runs[RunOpenHalf]
	own, ownInputs := paired(runs, RunSpread, RunTOwn)
	hot, hotInputs := paired(runs, RunHot, RunSpread)
	out := []Target{
		{Name: "1a new payments vs Temporal, kasa's shape", Formula: "payments/s ÷ T(" + PaymentShape.String() + ") run beside it",
			Value: own, Threshold: 0.8, Inputs: ownInputs},
		{Name: "1b new payments vs Temporal, leanest shape", Formula: "payments/s ÷ T(" + LeanestShape.String() + ")",
			Value: ratio(spread.NewPaymentRate, tLean.Throughput), Threshold: 0.5,
			Inputs: fmt.Sprintf("%.1f ÷ %.1f", spread.NewPaymentRate, tLean.Throughput)},
		{Name: "2 replays vs min(R, H)", Formula: "replays/s ÷ min(pgbench replay tps, GET /healthz req/s)",
			Value: ratio(replay.Throughput, min(r.TPS, h.Throughput)), Threshold: 0.5,
			Inputs: fmt.Sprintf("%.1f ÷ min(%.1f, %.1f)", replay.Throughput, r.TPS, h.Throughput)},
		{Name: "3 one hot merchant vs many", Formula: "payments/s with 1 merchant ÷ with many, run beside it",
			Value: hot, Threshold: 0.9, Inputs: hotInputs},
	}
	if _, ok := runs[RunReplayLarge+" #1"]; ok {
		large, largeInputs := paired(runs, RunReplayLarge, RunHLarge)
		small, smallInputs := paired(runs, RunReplay, RunHTTP)
		out = append(out, Target{Name: "4 replays with a large table", Formula: "(replays/s large ÷ H beside it) ÷ (replays/s small ÷ H beside it)",
			Value: ratio(large, small), Threshold: 0.9, Inputs: fmt.Sprintf("(%s) ÷ (%s)", largeInputs, smallInputs)})
	}
	if _, ok := runs[RunSpreadLarge+" #1"]; ok {
		large, largeInputs := paired(runs, RunSpreadLarge, RunTLarge)
		out = append(out, Target{Name: "4 new payments with a large table", Formula: "(payments/s large ÷ T beside it) ÷ (payments/s small ÷ T beside it)",
			Value: ratio(large, own), Threshold: 0.9, Inputs: fmt.Sprintf("(%s) ÷ (%s)", largeInputs, ownInputs)})
	}
	for i := range out {
		out[i].Met = out[i].Value >= out[i].Threshold
	}
	// Target 5 is an upper bound: p99 within 3 × p50.
	p99p50 := ratio(open.Latency.P99, open.Latency.P50)
	return append(out, Target{Name: "5 tail at half the max rate", Formula: "p99 ÷ p50 (at most)",
		Value: p99p50, Threshold: 3, Met: p99p50 > 0 && p99p50 <= 3,
		Inputs: fmt.Sprintf("%.1f ms ÷ %.1f ms at %.1f/s", open.Latency.P99, open.Latency.P50, open.Rate)})
}
