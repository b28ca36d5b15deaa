package bench

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	sdkworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/kasa-pay/kasa/workflows"
)

// Stack is a running kasa to measure, and what the suite needs to reach around it.
type Stack struct {
	APIURL, SimURL, AdminToken, DatabaseURL string
	Temporal                                client.Client
	Verify                                  func(ctx context.Context) ([]string, error)         // kasa verify: the invariant violations
	Preload                                 func(ctx context.Context, fx *Fixture, n int) error // n finished payments for fx's merchants
	Settle                                  func(ctx context.Context) error                     // vacuum, analyze and checkpoint
	CPU                                     CPU                                                 // if set, each run reports its CPU by process class
	Counters                                Counters                                            // if set, each comparison run reports their growth per operation
}

// Report is one suite run: every measurement, the ratios the targets ask for, and its verdict.
type Report struct {
	Started    time.Time                `json:"started"`
	Machine    string                   `json:"machine"`
	Commit     string                   `json:"commit"`
	Capability string                   `json:"provider_capability,omitempty"` // KASA_PROVIDER_CAPABILITY of the measured kasa
	Options    Options                  `json:"options"`
	Runs       []Result                 `json:"runs"` // in the order run; most twice (passes #1 and #2), see targets
	PGBench    map[string]PGBenchResult `json:"pgbench"`
	Targets    []Target                 `json:"targets"`
	Verdict
}

// Verdict says whether runs were correct: a run that charged a payment twice or broke an
// invariant failed, whatever its speed.
type Verdict struct {
	Checked  int      `json:"payments_checked"` // payments whose charges were counted at the simulator
	Doubles  int      `json:"double_charges"`
	Problems []string `json:"verify_problems"` // kasa verify's
	// Refunds: those checked at the bank simulator and against their payments (CheckRefunds),
	// those refunded more than once there, and every mismatch found.
	RefundsChecked int      `json:"refunds_checked"`
	RefundDoubles  int      `json:"double_refunds"`
	RefundProblems []string `json:"refund_problems,omitempty"`
	Correct        bool     `json:"correct"`
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
)

// SuiteRefundShare is the refund mix of the suite's RunRefundMix when Options.RefundShare is 0.
// Real refunds are a few percent of payments, but at that share a 15 s window at ~80 operations/s
// holds a few dozen refunds, too few for a p99; a fifth gives ~200, and each payment's four
// quarter refunds keep the run well supplied with refundable payments.
const SuiteRefundShare = 0.2

// Check counts at the bank simulator the charges of every payment that may have moved money (any
// not failed), checks the refunds (CheckRefunds), and runs kasa verify.
func (s Stack) Check(ctx context.Context, payments map[string]string, refunds map[string]RefundOf) (v Verdict, err error) {
	var ids []string
	for id, status := range payments {
		if status != "failed" {
			ids = append(ids, id)
		}
	}
	if v.Doubles, err = CheckCharges(ctx, s.SimURL, ids); err != nil {
		return v, fmt.Errorf("check charges: %w", err)
	}
	rv, err := CheckRefunds(ctx, s.APIURL, s.SimURL, refunds)
	if err != nil {
		return v, fmt.Errorf("check refunds: %w", err)
	}
	v.RefundsChecked, v.RefundDoubles, v.RefundProblems = rv.RefundsChecked, rv.RefundDoubles, rv.RefundProblems
	if v.Problems, err = s.Verify(ctx); err != nil {
		return v, fmt.Errorf("verify: %w", err)
	}
	v.Checked, v.Correct = len(ids), v.Doubles == 0 && len(v.Problems) == 0 && v.RefundDoubles == 0 && len(v.RefundProblems) == 0
	return v, nil
}

// step is one run of the suite: ceiling T of a shape, or a load run with opts against fx.
type step struct {
	name  string
	shape *Shape
	opts  Options
	fx    *Fixture
}

// RunSuite runs the standard suite against s, shaped by o's Duration, Warmup, Concurrency,
// Merchants (of the spread load; the hot load has one), Duplicates, Insufficient, Preload and
// RefundShare (of RunRefundMix only; default SuiteRefundShare).
func RunSuite(ctx context.Context, s Stack, o Options) (*Report, error) {
	rep := &Report{Started: time.Now().UTC(), Options: o, PGBench: map[string]PGBenchResult{}}
	byName, payments, refunds := map[string]Result{}, map[string]string{}, map[string]RefundOf{}
	// pass runs its steps one after the other, or in mirror order, after settling the database
	// if asked, so that a measurement does not pay for the writes before it.
	pass := func(settle, mirrored bool, steps ...step) error {
		if settle {
			if err := s.Settle(ctx); err != nil {
				return err
			}
		}
		if mirrored {
			slices.Reverse(steps)
		}
		for _, st := range steps {
			opts := st.opts
			opts.APIURL, opts.AdminToken, opts.CPU, opts.Warmup = s.APIURL, s.AdminToken, s.CPU, o.Warmup
			opts.Duration, opts.Concurrency = orDefault(opts.Duration, o.Duration), orDefault(opts.Concurrency, o.Concurrency)
			var r Result
			var err error
			if st.shape != nil {
				r, err = WorkflowCeiling(ctx, s.Temporal, *st.shape, opts)
			} else {
				r, err = Run(ctx, opts, st.fx)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", st.name, err)
			}
			r.Path = st.name + " (" + r.Path + ")"
			rep.Runs, byName[st.name] = append(rep.Runs, r), r
			for id, status := range r.Payments {
				notePayment(payments, id, status)
			}
			maps.Copy(refunds, r.RefundsSeen)
			o.Progress("%-40s %8.1f req/s  %8.1f new/s  p50 %7.1f ms  p99 %7.1f ms  errors %d",
				st.name, r.Throughput, r.NewPaymentRate, r.Latency.P50, r.Latency.P99, r.Errors)
			if rs := r.Refunds; rs != nil {
				o.Progress("%-40s %8.1f refunds/s beside %.1f new payments/s  refund p50 %7.1f ms  p99 %7.1f ms",
					"", rs.Rate, r.NewPaymentRate, rs.Latency.P50, rs.Latency.P99)
			}
		}
		return nil
	}
	// Ceiling T of the leanest shape runs before and after the payment runs, and the higher of the
	// two counts: on a shared machine a ceiling measured during someone else's load would flatter
	// every ratio against it.
	if err := pass(false, false, step{name: RunTLean + " #1", shape: &LeanestShape}); err != nil {
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
	// over minutes here. So a pass runs T, new payments with many merchants, with one, replays and
	// H one after the other, and the second pass mirrors the order, weighing a drift alike on both sides.
	kasaRuns := func(p string) []step {
		return []step{{name: RunTOwn + p, shape: &PaymentShape}, {name: RunSpread + p, opts: payOpts, fx: spread},
			{name: RunHot + p, opts: payOpts, fx: hot}, {name: RunReplay + p, opts: Options{Path: "replay"}, fx: hot},
			{name: RunHTTP + p, opts: Options{Path: "/healthz"}}}
	}
	if err := pass(true, false, kasaRuns(" #1")...); err != nil {
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
	// Half the maximum sustained rate, open loop: latency without coordinated omission. Three
	// times as long as the other runs: at half the rate a p99 needs the samples.
	half := Options{Rate: max(byName[RunSpread+" #1"].NewPaymentRate/2, 1), Concurrency: 256, Insufficient: o.Insufficient, Duration: 3 * o.Duration}
	if err := pass(true, false, step{name: RunOpenHalf, opts: half, fx: spread}); err != nil {
		return nil, err
	}
	if err := pass(true, true, kasaRuns(" #2")...); err != nil {
		return nil, err
	}
	if err := pass(false, false, step{name: RunTLean + " #2", shape: &LeanestShape}); err != nil {
		return nil, err
	}
	// Refunds beside new payments: a step of its own after the paired passes, so that no target's
	// runs or their neighbours change; no target divides by it.
	mix := Options{Duplicates: o.Duplicates, Insufficient: o.Insufficient, RefundShare: cmp.Or(o.RefundShare, SuiteRefundShare)}
	if err := pass(true, false, step{name: RunRefundMix, opts: mix, fx: spread}); err != nil {
		return nil, err
	}
	for _, name := range []string{RunHTTP, RunTLean, RunSpread, RunReplay} { // the faster pass counts
		byName[name] = slices.MaxFunc([]Result{byName[name+" #1"], byName[name+" #2"]}, func(a, b Result) int { return cmp.Compare(rate(a), rate(b)) })
	}

	if o.Preload > 0 {
		o.Progress("preloading %d payments with their idempotency records", o.Preload)
		if err := s.Preload(ctx, spread, o.Preload); err != nil {
			return nil, fmt.Errorf("preload: %w", err)
		}
		// Each side is taken relative to a run beside it (new payments to T, replays to H), in mirrored
		// passes; these T and H runs are shorter: they only read the machine's pace.
		for _, p := range []string{" #1", " #2"} {
			err := pass(true, p == " #2", step{name: RunTLarge + p, shape: &PaymentShape, opts: Options{Duration: max(o.Duration/2, time.Second)}},
				step{name: RunSpreadLarge + p, opts: payOpts, fx: spread}, step{name: RunReplayLarge + p, opts: Options{Path: "replay"}, fx: hot},
				step{name: RunHLarge + p, opts: Options{Path: "/healthz", Duration: max(o.Duration/3, time.Second)}})
			if err != nil {
				return nil, err
			}
		}
	}
	// Correctness: a fast run that charged twice or broke an invariant failed.
	o.Progress("checking the payments at the bank simulator and running kasa verify")
	if rep.Verdict, err = s.Check(ctx, payments, refunds); err != nil {
		return nil, err
	}
	rep.Targets = targets(byName, rep.PGBench)
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
	spread, tLean := runs[RunSpread], runs[RunTLean]
	replay, h, r := runs[RunReplay], runs[RunHTTP], pg["replay"]
	open := runs[RunOpenHalf]
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
	// Target 5 is an upper bound: p99 within 3 × p50.
	p99p50 := ratio(open.Latency.P99, open.Latency.P50)
	out = append(out, Target{Name: "5 tail at half the max rate", Formula: "p99 ÷ p50 (at most)",
		Value: p99p50, Threshold: 3, Met: p99p50 > 0 && p99p50 <= 3,
		Inputs: fmt.Sprintf("%.1f ms ÷ %.1f ms at %.1f/s", open.Latency.P99, open.Latency.P50, open.Rate)})
	for i := range out[:len(out)-1] {
		out[i].Met = out[i].Value >= out[i].Threshold
	}
	return out
}

// Shape is a workflow's skeleton: its steps, each L (a local activity, run inside the workflow
// task) or R (a regular activity, a task of its own through the server); whether it starts
// eagerly (its first workflow task handed to the starting process's worker); and whether it is
// started with search attributes and upserts PaymentStatus once at the end, as a payment does.
type Shape struct {
	Steps                   string
	Eager, SearchAttributes bool
}

func (s Shape) String() string {
	out := s.Steps
	if s.Eager {
		out += "+eager"
	}
	if s.SearchAttributes {
		out += "+search-attributes"
	}
	return out
}

// PaymentShape is PaymentWorkflow's happy path: the worker's charge policy, reserve, charge,
// finalize, each a local activity, started eagerly (Starter.StartPayment).
// TestPaymentShapeMatchesARecordedPayment checks it.
var PaymentShape = Shape{Steps: "LLLL", Eager: true, SearchAttributes: true}

// ShapeFor is the shape of a payment that succeeds at its first charge with a provider of the
// given capability: PaymentShape for all three, as the capabilities differ only when an attempt
// is repeated (workflows.ChargeInput.Capability). TestShapeForEveryCapability checks it.
func ShapeFor(workflows.Capability) Shape { return PaymentShape }

// HistoryShape is the shape a recorded workflow history shows. Eager start is not recorded in a
// history, so Eager is always false.
func HistoryShape(h *historypb.History) Shape {
	var s Shape
	started, upserts := false, 0
	for _, e := range h.GetEvents() {
		switch e.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
			started = len(e.GetWorkflowExecutionStartedEventAttributes().GetSearchAttributes().GetIndexedFields()) > 0
		case enumspb.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
			upserts++
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			s.Steps += "R"
		case enumspb.EVENT_TYPE_MARKER_RECORDED:
			if e.GetMarkerRecordedEventAttributes().GetMarkerName() == "LocalActivity" { // the SDK's marker of a local activity's result
				s.Steps += "L"
			}
		}
	}
	s.SearchAttributes = started && upserts == 1
	return s
}

// LeanestShape is the fastest shape Temporal allows for three steps: one workflow task.
var LeanestShape = Shape{Steps: "LLL", Eager: true}

// Noop is the ceiling's step: nothing.
func Noop(context.Context) error { return nil }

// ShapeWorkflow runs s's steps, each the no-op activity.
func ShapeWorkflow(ctx workflow.Context, s Shape) error {
	local := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: 10 * time.Second})
	regular := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: 10 * time.Second})
	for _, k := range s.Steps {
		var err error
		if k == 'L' {
			err = workflow.ExecuteLocalActivity(local, Noop).Get(ctx, nil)
		} else {
			err = workflow.ExecuteActivity(regular, "bench.noop").Get(ctx, nil)
		}
		if err != nil {
			return err
		}
	}
	if s.SearchAttributes {
		return workflow.UpsertTypedSearchAttributes(ctx, workflows.SearchPaymentStatus.ValueSet("succeeded"))
	}
	return nil
}

// WorkflowCeiling is ceiling T: workflows of the shape with no-op steps, run back to back by
// o.Concurrency clients on a task queue served by a worker in this process, measured as Run does.
func WorkflowCeiling(ctx context.Context, tc client.Client, shape Shape, o Options) (Result, error) {
	queue := "bench-shape-" + uuid.NewString()
	w := sdkworker.New(tc, queue, sdkworker.Options{})
	w.RegisterWorkflowWithOptions(ShapeWorkflow, workflow.RegisterOptions{Name: "bench.shape"})
	w.RegisterActivityWithOptions(Noop, activity.RegisterOptions{Name: "bench.noop"})
	if err := w.Start(); err != nil {
		return Result{}, fmt.Errorf("ceiling worker: %w", err)
	}
	defer w.Stop()

	o.Path = "temporal:" + shape.String()
	r := newRunner(o, nil)
	r.op = func(ctx context.Context) outcome {
		o := client.StartWorkflowOptions{ID: "bench-shape-" + uuid.NewString(), TaskQueue: queue, EnableEagerStart: shape.Eager}
		if shape.SearchAttributes {
			o.TypedSearchAttributes = temporal.NewSearchAttributes(
				workflows.SearchPaymentStatus.ValueSet("processing"), workflows.SearchMerchantID.ValueSet("bench"))
		}
		run, err := tc.ExecuteWorkflow(ctx, o, "bench.shape", shape)
		if err == nil {
			err = run.Get(ctx, nil)
		}
		return outcome{ans: answer{label: "completed"}, done: time.Now(), err: err}
	}
	return r.measure(ctx)
}

// Markdown is a summary table with one row per run, the answers of every run, and what an
// operation of each run cost in CPU by process class, if any run measured it.
func Markdown(title string, runs ...Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## %s\n\n| # | path | mode | clients | rate/s | merchants | s | requests | req/s | new payments/s | p50 ms | p90 ms | p95 ms | p99 ms | max ms | errors | unsent |\n", title)
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, r := range runs {
		rate := "-"
		if r.Rate > 0 {
			rate = fmt.Sprint(math.Round(r.Rate*10) / 10) // the suite's half rate is a quotient
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
	if slices.ContainsFunc(runs, func(r Result) bool { return r.Refunds != nil }) {
		b.WriteString("\nRefunds beside the new payments of the runs with a refund mix (refund latency: of the refund requests alone):\n\n")
		b.WriteString("| # | refund share | new payments/s | refunds/s | refund requests | refund p50 ms | refund p90 ms | refund p99 ms | refund max ms |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	}
	for i, r := range runs {
		if rs := r.Refunds; rs != nil {
			fmt.Fprintf(&b, "| %d | %.2f | %.1f | %.1f | %d | %.2f | %.2f | %.2f | %.2f |\n", i+1, rs.Share, r.NewPaymentRate, rs.Rate, rs.Requests,
				rs.Latency.P50, rs.Latency.P90, rs.Latency.P99, rs.Latency.Max)
		}
	}
	if slices.ContainsFunc(runs, func(r Result) bool { return r.CPU != nil }) {
		fmt.Fprintf(&b, "\nCPU per operation, in milliseconds, over each run's measured window. kasa: kasa's processes (the measured `kasa dev`: "+
			"API, worker, relay, webhook consumer, embedded NATS); banksim: the bank simulator, a process of its own; bench: the load generator, and T's worker in T runs. "+
			"**kasa's own** = kasa + kasa's part of PostgreSQL (the backends of kasa's database, and PostgreSQL's shared time in their proportion: %s); "+
			"own ÷ temporal: target ≤ %.1f.\n\n", "pg kasa", OwnTarget)
		b.WriteString("| # | per | kasa | postgres | pg kasa | temporal | banksim | bench | other | all | cores busy | **kasa's own** | own ÷ temporal |\n" +
			"|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	}
	for i, r := range runs {
		if r.CPU == nil {
			continue
		}
		m, all := r.CPU.MS, 0.0
		for _, ms := range m {
			all += ms
		}
		other := max(all-m[ClassKasa]-m[ClassPostgres]-m[ClassTemporal]-m[ClassBanksim]-m[ClassBench], 0) // never a rounding's -0.00
		ratio := "-"
		if o := r.CPU.Own; o.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f (%s)", o.Ratio, map[bool]string{true: "met", false: "**not met**"}[o.Met])
		}
		fmt.Fprintf(&b, "| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | **%.2f** | %s |\n",
			i+1, r.CPU.Per, m[ClassKasa], m[ClassPostgres], r.CPU.Own.Postgres, m[ClassTemporal], m[ClassBanksim], m[ClassBench], other, all, r.CPU.Cores,
			r.CPU.Own.MS, ratio)
	}
	return b.String()
}

// cell keeps a value from breaking its table row.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// SuiteMarkdown is a suite's report: verdict, targets with their inputs, runs, database ceilings.
func SuiteMarkdown(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# kasa bench, %s\n\nMachine: %s. Commit: %s. Each run: %s measured after %s of warm-up, %d clients.\n\n",
		rep.Started.Format("2006-01-02 15:04 UTC"), rep.Machine, rep.Commit, rep.Options.Duration, rep.Options.Warmup, rep.Options.Concurrency)
	if rep.Capability != "" { // and the shape a payment has with each capability (ShapeFor), which ceiling T copies
		var shapes []string
		for _, c := range workflows.Capabilities {
			shapes = append(shapes, fmt.Sprintf("`%s` %s", c, ShapeFor(c)))
		}
		fmt.Fprintf(&b, "Provider capability: %s. kasa's workflow shape for a payment that succeeds at its first charge, by provider capability: %s.\n\n",
			rep.Capability, strings.Join(shapes, ", "))
	}
	b.WriteString(correctness(rep.Verdict))
	for _, r := range rep.Runs {
		if rs := r.Refunds; rs != nil {
			fmt.Fprintf(&b, "Refunds: %s ran %.1f refunds/s beside %.1f new payments/s (a share of %.2f of its operations; refund p50 %.1f ms, p99 %.1f ms).\n\n",
				cell(r.Path), rs.Rate, r.NewPaymentRate, rs.Share, rs.Latency.P50, rs.Latency.P99)
		}
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
	b.WriteString(Markdown("Runs", rep.Runs...))
	b.WriteString("\n## Database ceilings (pgbench, same PostgreSQL, same client count)\n\n| script | clients | tps | avg ms | p50 ms | p99 ms | failed |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, name := range slices.Sorted(maps.Keys(rep.PGBench)) {
		r := rep.PGBench[name]
		fmt.Fprintf(&b, "| %s | %d | %.1f | %.2f | %.2f | %.2f | %d |\n", name, r.Clients, r.TPS, r.LatencyAvgMS, r.P50MS, r.P99MS, r.Failed)
	}
	return b.String()
}

// RunReport is one run that `kasa bench --out` keeps: what it measured and whether it was correct.
type RunReport struct {
	Started    time.Time `json:"started"`
	Machine    string    `json:"machine"`
	Commit     string    `json:"commit"`
	Capability string    `json:"provider_capability,omitempty"`
	Options    Options   `json:"options"`
	Run        Result    `json:"run"`
	Verdict
}

// RunMarkdown is a kept run's report: its setting and verdict, then body (Markdown of the run).
func RunMarkdown(rep RunReport, body string) string {
	var b strings.Builder
	o := rep.Options
	fmt.Fprintf(&b, "# kasa bench run, %s\n\nMachine: %s (shared: other work on it skews every figure). Commit: %s. Provider capability: %s. "+
		"%s measured after %s of warm-up, %d clients, %d merchants with %d payer(s) each; duplicates %.2f, insufficient %.2f, refund share %.2f.\n\n",
		rep.Started.Format("2006-01-02 15:04 UTC"), rep.Machine, rep.Commit, cmp.Or(rep.Capability, "?"), o.Duration, o.Warmup, o.Concurrency,
		o.Merchants, o.Payers, o.Duplicates, o.Insufficient, o.RefundShare)
	b.WriteString(correctness(rep.Verdict))
	b.WriteString(body)
	return b.String()
}

// correctness is a verdict's paragraph, with each problem found.
func correctness(v Verdict) string {
	var b strings.Builder
	verdict := "**correct**: no payment was charged twice, no refund refunded twice or missing, and `kasa verify` found no problem"
	if !v.Correct {
		verdict = fmt.Sprintf("**FAILED**: %d double charge(s), %d double refund(s), %d refund mismatch(es), %d invariant violation(s)",
			v.Doubles, v.RefundDoubles, len(v.RefundProblems), len(v.Problems))
	}
	fmt.Fprintf(&b, "Correctness: %s (%d payments and %d refunds checked at the bank simulator).\n\n", verdict, v.Checked, v.RefundsChecked)
	problems := append(slices.Clone(v.Problems), v.RefundProblems...)
	for _, p := range problems {
		fmt.Fprintf(&b, "- %s\n", cell(p))
	}
	if len(problems) > 0 {
		b.WriteString("\n")
	}
	return b.String()
}
