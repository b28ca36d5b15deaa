// Package bench measures kasa: an HTTP load generator over the REST API (docs/openapi.yaml),
// closed loop (clients back to back) or open loop (arrivals on a schedule, latency counted from
// the intended send time: no coordinated omission), the ceilings it is held to, and the suite.
package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/tools/kasaapi"
)

// Options describe one run, or the standard suite (RunSuite). Zero values get the defaults noted.
type Options struct {
	APIURL           string        `json:"-"` // kasa API base URL
	AdminToken       string        `json:"-"` // KASA_ADMIN_TOKEN, for Setup: kept out of the results
	Duration, Warmup time.Duration // measured window (default 10s), and load before it not recorded
	Concurrency      int           // clients (closed loop) or cap on requests in flight (open loop); default 16
	Rate             float64       `json:",omitempty"` // > 0: open loop at this many arrivals per second
	Merchants        int           // Setup: merchants; default 1
	Payers           int           `json:",omitempty"` // Setup: payer accounts per merchant; default 1
	// Duplicates is the share of requests that are duplicates: half re-send an earlier request
	// byte for byte (a retry), half send a new payment with a parallel second copy (a race on the key).
	Duplicates   float64
	Insufficient float64 // share of new payments for more than the payer ever had
	// RefundShare (0 to below 1) is the share of operations that refund a quarter of a payment
	// that succeeded earlier in the run, each under a key of its own (path payments only).
	RefundShare float64 `json:",omitempty"`
	// ManualShare (0 to below 1) is the share of new payments created with "capture": "manual"
	// (path payments only), each authorized one then captured in part or canceled (newCommand).
	ManualShare float64 `json:",omitempty"`
	// Path: "payments" (default, POST /v1/payments), "replay" (re-sends of finished payments only),
	// or a raw path such as "/healthz" (GET without auth).
	Path     string                           `json:",omitempty"`
	Preload  int                              // RunSuite: stored payments for the large-table runs; 0 skips them
	CPU      CPU                              `json:"-"` // if set, a run reports the CPU its window cost, by process class
	Counters Counters                         `json:"-"` // if set, a run reports each counter's growth per operation
	Progress func(format string, args ...any) `json:"-"` // RunSuite's progress lines
}

// Result is what a run measured: only requests whose (intended) send time falls in the window count.
type Result struct {
	Path           string             `json:"path"`
	Mode           string             `json:"mode"` // "closed" or "open"
	Concurrency    int                `json:"concurrency"`
	Rate           float64            `json:"rate,omitempty"`
	Merchants      int                `json:"merchants,omitempty"`
	Duration       float64            `json:"duration_s"`
	Requests       int64              `json:"requests"`         // answered, whatever the status (a race sends two)
	Errors         int64              `json:"errors"`           // transport errors: no HTTP answer
	Unsent         int64              `json:"unsent,omitempty"` // open loop: due arrivals never sent, every client busy to the end
	Throughput     float64            `json:"throughput_rps"`
	NewPayments    int64              `json:"new_payments"` // new keys answered with a payment (201, 402, 202)
	NewPaymentRate float64            `json:"new_payments_per_s"`
	Latency        Latency            `json:"latency_ms"`
	Answers        map[string]int64   `json:"answers"` // "201 succeeded", "409 idempotency_key_in_use", "201 replayed", ...
	FirstError     string             `json:"first_error,omitempty"`
	CPU            *CPUUse            `json:"cpu,omitempty"`
	PerOp          map[string]float64 `json:"counters_per_op,omitempty"` // Options.Counters' growth over the window ÷ operations
	Refunds        *RefundStats       `json:"refunds,omitempty"`         // with a refund mix; then Latency covers payments and refunds
	Manual         *ManualStats       `json:"manual,omitempty"`          // with a manual mix; then Latency covers payments, captures and cancels
	// Payments (every payment id answered, warmup included, to its latest status), RefundsSeen
	// (every refund id to its payment) and ManualSeen (every manual payment id) are for the
	// correctness check; kept out of the JSON as they can be large.
	Payments    map[string]string   `json:"-"`
	RefundsSeen map[string]RefundOf `json:"-"`
	ManualSeen  map[string]ManualOf `json:"-"`
}

// Latency quantiles in milliseconds, from the intended send time to the last body byte.
type Latency struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

const (
	recentKeys = 64  // earlier requests a client remembers for retries
	replayPool = 200 // finished payments the replay path re-sends
	// The payments' currency and amounts in minor units, uniform in [minAmount, maxAmount].
	currency             = "TRY"
	minAmount, maxAmount = 100, 10_000
)

func (o Options) withDefaults() (Options, error) {
	o.APIURL = strings.TrimRight(o.APIURL, "/")
	o.Path = cmp.Or(o.Path, "payments")
	o.Duration, o.Concurrency = orDefault(o.Duration, 10*time.Second), orDefault(o.Concurrency, 16)
	o.Merchants, o.Payers = max(o.Merchants, 1), max(o.Payers, 1)
	if o.Path != "payments" && o.Path != "replay" && !strings.HasPrefix(o.Path, "/") {
		return o, fmt.Errorf("bench: unknown path %q (payments, replay or /raw/path)", o.Path)
	}
	for name, share := range map[string]float64{"refund": o.RefundShare, "manual": o.ManualShare} {
		if share < 0 || share >= 1 || (share > 0 && o.Path != "payments") {
			return o, fmt.Errorf("bench: %s share %v: from 0 to below 1, on path payments only", name, share)
		}
	}
	return o, nil
}

// orDefault is v, or def when v is not positive.
func orDefault[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// newClient returns one client for a whole run: keep-alive with enough idle connections that no
// client dials again, no proxy and no HTTP/2 (kasa is measured, not a proxy or a multiplexer).
func newClient(conns int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.MaxIdleConns = 2*conns + 16
	t.MaxIdleConnsPerHost = t.MaxIdleConns // a race copy may hold a second connection per client
	t.DisableCompression, t.ForceAttemptHTTP2 = true, false
	return &http.Client{Transport: t, Timeout: time.Minute}
}

// request is one HTTP request; payment requests keep their exact bytes so a retry is identical.
type request struct {
	method, url, token, key string
	body                    []byte
	isNew                   bool   // the first request for its key
	amount                  int64  // a new payment's, in minor units
	manual                  bool   // a new payment's: "capture": "manual"
	kind, of                string // a command (kindRefund, kindCapture, kindCancel) and its payment's id; "" for a payment
}

// The commands on a payment the generator sends, which prefix their answers' labels.
const (
	kindRefund  = "refund"
	kindCapture = "capture"
	kindCancel  = "cancel"
)

// outcome is what became of a request: its classified answer and body, or a transport error.
type outcome struct {
	ans  answer
	code int
	body []byte
	done time.Time
	err  error
}

// answer is a classified HTTP answer.
type answer struct {
	label     string // "201 succeeded", "402 insufficient_funds", "409 idempotency_key_in_use", "201 replayed", "200"
	paymentID string
	status    string // payment status when the body is a payment resource
	replayed  bool
}

// classify names an answer by its HTTP status and, in that order, the Idempotent-Replayed header,
// the `code` of a problem+json body, or the `status` (failed: the `failure_code`) of a payment.
func classify(code int, h http.Header, body []byte) answer {
	a := answer{label: strconv.Itoa(code), replayed: h.Get("Idempotent-Replayed") == "true"}
	var v struct {
		ID, Code    string
		Status      json.RawMessage // a string in payments, a number in problems
		FailureCode string          `json:"failure_code"`
	}
	if json.Unmarshal(body, &v) == nil && v.Code == "" && json.Unmarshal(v.Status, &a.status) == nil && a.status != "" {
		a.paymentID = v.ID
	}
	what := cmp.Or(v.Code, a.status)
	if a.status == "failed" {
		what = cmp.Or(v.FailureCode, what)
	}
	if a.replayed {
		what = "replayed"
	}
	if what != "" {
		a.label += " " + what
	}
	return a
}

// send sends r and classifies its answer.
func send(ctx context.Context, hc *http.Client, r request) (o outcome) {
	defer func() { o.done = time.Now() }()
	var headers []string
	if r.key != "" {
		headers = []string{"Idempotency-Key", r.key}
	}
	a, err := kasaapi.Do(ctx, hc, r.method, r.url, r.token, r.body, headers...)
	if err != nil {
		return outcome{err: err}
	}
	return outcome{ans: classify(a.Status, a.Header, a.Body), code: a.Status, body: a.Body}
}

// runner is one run: its options, and what its clients recorded (under mu).
type runner struct {
	opts                 Options
	fx                   *Fixture
	hc                   *http.Client
	pool                 []request // replay path: finished payments
	start, measured, end time.Time
	op                   func(context.Context) outcome // if set, what a client does instead of HTTP requests
	refunds              partPool                      // with a refund mix: the payments to refund
	manual               partPool                      // with a manual mix: the authorizations to capture or cancel

	mu        sync.Mutex
	res       Result          // the answers, errors, new payments and payments seen
	lat       []time.Duration // of the requests sent in the window
	refundLat []time.Duration // of the refund requests among them
	payLat    []time.Duration // with a manual mix: of the payment requests among them
	cmdLat    []time.Duration // of the capture and cancel requests among them
}

func newRunner(opts Options, fx *Fixture) *runner {
	r := &runner{opts: opts, fx: fx, refunds: partPool{parts: refundParts}, manual: partPool{parts: 1},
		res: Result{Answers: map[string]int64{}, Payments: map[string]string{}, RefundsSeen: map[string]RefundOf{}, ManualSeen: map[string]ManualOf{}}}
	if opts.RefundShare > 0 {
		r.res.Refunds = &RefundStats{}
	}
	if opts.ManualShare > 0 {
		r.res.Manual = &ManualStats{}
	}
	return r
}

// Run drives the API for opts.Warmup + opts.Duration with fx from Setup (nil for a raw path). If
// ctx ends first, it returns what it measured so far and ctx's error.
func Run(ctx context.Context, opts Options, fx *Fixture) (Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Result{}, err
	}
	if !strings.HasPrefix(opts.Path, "/") && fx == nil {
		return Result{}, fmt.Errorf("bench: path %q needs a Fixture from Setup", opts.Path)
	}
	r := newRunner(opts, fx)
	r.hc = newClient(opts.Concurrency)
	defer r.hc.CloseIdleConnections()
	if opts.Path == "replay" {
		if err := r.prime(ctx); err != nil {
			return Result{}, err
		}
	}
	return r.measure(ctx)
}

// measure runs the clients for the warmup and the window. In the open loop a free client takes
// the next arrival, whose latency counts from its scheduled time: queueing shows in the quantiles.
func (r *runner) measure(ctx context.Context) (Result, error) {
	o := r.opts
	r.start = time.Now()
	r.measured = r.start.Add(o.Warmup)
	r.end = r.measured.Add(o.Duration)
	arrivals := make(chan time.Time)
	var wg sync.WaitGroup
	for range o.Concurrency {
		wg.Go(func() {
			var recent []request // this client's earlier payments, to retry one
			for t := range arrivals {
				r.fire(ctx, t, &recent)
			}
			for now := time.Now(); o.Rate <= 0 && ctx.Err() == nil && now.Before(r.end); now = time.Now() {
				if !r.fire(ctx, now, &recent) {
					sleep(ctx, 10*time.Millisecond) // a refused connection fails at once: do not spin a core
				}
			}
		})
	}
	go func() {
		if o.Rate > 0 {
			r.res.Unsent = r.schedule(ctx, arrivals)
		}
		close(arrivals) // after Unsent is set: the clients end, and wg.Wait returns, after this
	}()
	used, counted := sampleBetween(ctx, o.CPU, o.Counters, r.measured, r.end)
	wg.Wait()

	window := o.Duration
	if ctx.Err() != nil {
		window = min(max(time.Since(r.measured), 0), window)
	}
	res := r.res
	res.Path, res.Mode, res.Concurrency, res.Rate = o.Path, map[bool]string{false: "closed", true: "open"}[o.Rate > 0], o.Concurrency, o.Rate
	if r.fx != nil {
		res.Merchants = len(r.fx.Merchants)
	}
	secs := window.Seconds()
	res.Duration, res.Requests, res.Latency = secs, int64(len(r.lat)), latencyOf(r.lat)
	res.Throughput, res.NewPaymentRate = ratio(float64(res.Requests), secs), ratio(float64(res.NewPayments), secs)
	if rs := res.Refunds; rs != nil {
		rs.Share, rs.Requests, rs.Latency = o.RefundShare, int64(len(r.refundLat)), latencyOf(r.refundLat)
		rs.Rate = ratio(float64(rs.New), secs)
	}
	if ms := res.Manual; ms != nil {
		ms.Share, ms.Commands, ms.Latency, ms.PaymentLatency = o.ManualShare, int64(len(r.cmdLat)), latencyOf(r.cmdLat), latencyOf(r.payLat)
		ms.CaptureRate, ms.CancelRate = ratio(float64(ms.Captures), secs), ratio(float64(ms.Cancels), secs)
	}
	per, ops := "request", res.Requests
	if r.op != nil {
		per = "workflow"
		res.NewPayments, res.NewPaymentRate = res.Requests, res.Throughput
	} else if n, what := operations(res); n > 0 {
		per, ops = what, n
	}
	res.CPU = cpuUse(used, o.Duration, per, ops)
	res.PerOp = perOp(counted, ops)
	return res, ctx.Err()
}

// operations counts a payment run's operations for its CPU and counters: new payments, and the
// refunds, captures and cancels of its mixes answered with their resource; and names them.
func operations(res Result) (n int64, what string) {
	n, names := res.NewPayments, []string{"new payment"}
	if rs := res.Refunds; rs != nil && rs.New > 0 {
		n, names = n+rs.New, append(names, "refund")
	}
	if ms := res.Manual; ms != nil && ms.Captures+ms.Cancels > 0 {
		n, names = n+ms.Captures+ms.Cancels, append(names, "capture/cancel")
	}
	if len(names) > 2 {
		names = []string{strings.Join(names[:len(names)-1], ", "), names[len(names)-1]}
	}
	return n, strings.Join(names, " or ")
}

// schedule sends arrival i at start + i/Rate (computed from i, so sleep overshoot never drifts the
// schedule) and returns how many arrivals of the measured window were due but never taken.
func (r *runner) schedule(ctx context.Context, arrivals chan<- time.Time) int64 {
	at := func(i int64) time.Time {
		return r.start.Add(time.Duration(float64(i) * float64(time.Second) / r.opts.Rate))
	}
	over := time.NewTimer(time.Until(r.end))
	defer over.Stop()
	for i := int64(0); at(i).Before(r.end); i++ {
		if sleep(ctx, time.Until(at(i))) != nil {
			return 0
		}
		select {
		case arrivals <- at(i):
		case <-ctx.Done():
			return 0
		case <-over.C:
			var n int64
			for ; at(i).Before(r.end); i++ {
				if !at(i).Before(r.measured) {
					n++
				}
			}
			return n
		}
	}
	return 0
}

// fire sends a client's next request (two in parallel for a race) as of the intended time and
// records the outcome. It returns false on a transport error.
func (r *runner) fire(ctx context.Context, intended time.Time, recent *[]request) bool {
	if r.op != nil {
		return r.record(ctx, intended, request{}, r.op(ctx))
	}
	reqs := r.next(recent)
	outs := make([]outcome, len(reqs))
	var wg sync.WaitGroup
	for i := 1; i < len(reqs); i++ {
		wg.Go(func() { outs[i] = send(ctx, r.hc, reqs[i]) })
	}
	outs[0] = send(ctx, r.hc, reqs[0])
	wg.Wait()
	ok := true
	for i := range reqs {
		ok = r.record(ctx, intended, reqs[i], outs[i]) && ok
	}
	return ok
}

func (r *runner) record(ctx context.Context, intended time.Time, req request, o outcome) bool {
	if o.err != nil && ctx.Err() != nil {
		return true // stopped by the caller, not a failure of the server
	}
	if req.kind != "" {
		o.ans.label = req.kind + " " + o.ans.label
	}
	// A payment that succeeded under its first request becomes refundable (once: a twin or a
	// retry is not its first request).
	if r.opts.RefundShare > 0 && req.isNew && req.kind == "" && o.ans.status == "succeeded" && !o.ans.replayed {
		r.refunds.add(o.ans.paymentID, req.token, req.amount)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch id := o.ans.paymentID; {
	case id == "":
	case req.kind == kindRefund:
		r.res.RefundsSeen[id] = RefundOf{PaymentID: req.of, APIKey: req.token}
	default:
		notePayment(r.res.Payments, id, o.ans.status)
		if req.manual || req.kind != "" { // a manual payment, or a capture or cancel of one
			seen, known := r.res.ManualSeen[id]
			// Authorized in its first answer (to the request or, in a race, to its twin): capturable, once.
			if !known && req.manual && o.code == http.StatusCreated && o.ans.status == "requires_capture" && !o.ans.replayed {
				r.manual.add(id, req.token, req.amount)
			}
			seen.APIKey, seen.Command = req.token, cmp.Or(req.kind, seen.Command)
			r.res.ManualSeen[id] = seen
		}
	}
	if intended.Before(r.measured) || !intended.Before(r.end) {
		return o.err == nil
	}
	if o.err != nil {
		r.res.Errors++
		r.res.FirstError = cmp.Or(r.res.FirstError, o.err.Error())
		return false
	}
	r.lat = append(r.lat, o.done.Sub(intended))
	r.res.Answers[o.ans.label]++
	answered := o.ans.paymentID != "" && !o.ans.replayed
	switch {
	case req.kind == kindRefund:
		r.refundLat = append(r.refundLat, o.done.Sub(intended))
		if answered {
			r.res.Refunds.New++
		}
	case req.kind != "": // a capture or cancel
		r.cmdLat = append(r.cmdLat, o.done.Sub(intended))
		switch {
		case !answered:
		case req.kind == kindCapture:
			r.res.Manual.Captures++
		default:
			r.res.Manual.Cancels++
		}
	default:
		if r.res.Manual != nil {
			r.payLat = append(r.payLat, o.done.Sub(intended))
		}
		if req.isNew && answered {
			r.res.NewPayments++
			if req.manual {
				r.res.Manual.Authorizations++
			}
		}
	}
	return true
}

// notePayment keeps a payment's most final status: a later "processing" never hides an outcome,
// and a manual payment's capture or cancel follows its "requires_capture".
func notePayment(m map[string]string, id, status string) {
	if old, ok := m[id]; !ok || old == "processing" || old == "requires_capture" {
		m[id] = status
	}
}

// next returns a client's next request(s), remembering new payments in recent.
func (r *runner) next(recent *[]request) []request {
	o := r.opts
	switch {
	case strings.HasPrefix(o.Path, "/"):
		return []request{{method: http.MethodGet, url: o.APIURL + o.Path}}
	case o.Path == "replay":
		return []request{r.pool[rand.IntN(len(r.pool))]}
	}
	if o.RefundShare > 0 {
		if part, ok := r.refunds.take(o.RefundShare); ok {
			return []request{r.newRefund(part)}
		}
	}
	if o.ManualShare > 0 {
		if auth, ok := r.manual.take(1); ok {
			return []request{r.newCommand(auth)}
		}
	}
	dup := len(*recent) > 0 && rand.Float64() < o.Duplicates
	if dup && rand.IntN(2) == 0 {
		old := (*recent)[rand.IntN(len(*recent))]
		old.isNew = false
		return []request{old}
	}
	p := r.newPayment()
	if *recent = append(*recent, p); len(*recent) > recentKeys {
		*recent = (*recent)[1:]
	}
	if dup { // a race: the same request twice at once
		twin := p
		twin.isNew = false
		return []request{p, twin}
	}
	return []request{p}
}

// newPayment builds a payment with a fresh key for a random payer of a random merchant.
func (r *runner) newPayment() request {
	m := &r.fx.Merchants[rand.IntN(len(r.fx.Merchants))]
	amount := minAmount + rand.Int64N(maxAmount-minAmount+1)
	if rand.Float64() < r.opts.Insufficient {
		amount += deposit // more than the payer ever had: balances only shrink during a run
	}
	key := uuid.NewString() // also the invoice: unique, so no payment is ever a duplicate_payment of another
	fields := map[string]string{"invoice_id": key, "amount": payment.FormatAmount(amount, currency),
		"currency": currency, "account_id": m.Payers[rand.IntN(len(m.Payers))]}
	manual := rand.Float64() < r.opts.ManualShare
	if manual {
		fields["capture"] = payment.CaptureManual
	}
	body, _ := json.Marshal(fields)
	return request{method: http.MethodPost, url: r.opts.APIURL + "/v1/payments", token: m.APIKey, key: key, body: body, isNew: true, amount: amount, manual: manual}
}

// prime creates the payments the replay path re-sends, keeping those that finished (201/402).
func (r *runner) prime(ctx context.Context) error {
	reqs, outs := make([]request, replayPool), make([]outcome, replayPool)
	for i := range reqs {
		reqs[i] = r.newPayment()
	}
	err := parallel(ctx, len(reqs), r.opts.Concurrency, func(ctx context.Context, i int) error {
		outs[i] = send(ctx, r.hc, reqs[i])
		return nil
	})
	for i, o := range outs {
		if o.ans.paymentID != "" {
			notePayment(r.res.Payments, o.ans.paymentID, o.ans.status)
		}
		if o.ans.status == "succeeded" || o.ans.status == "failed" {
			reqs[i].isNew = false
			r.pool = append(r.pool, reqs[i])
		}
	}
	if err == nil && len(r.pool) == 0 {
		err = fmt.Errorf("bench: replay path: none of %d payments finished within the sync wait (first answer: %s)",
			len(reqs), cmp.Or(outs[0].ans.label, fmt.Sprint(outs[0].err)))
	}
	return err
}

// quantile is the nearest-rank q-quantile of sorted values (the one of rank ceil(q·n)); 0 without any.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(max(int(math.Ceil(q*float64(len(sorted))))-1, 0), len(sorted)-1)]
}

// latencyOf sorts latencies and gives their quantiles.
func latencyOf(lat []time.Duration) Latency {
	slices.Sort(lat)
	q := func(q float64) float64 { return ms(quantile(lat, q)) }
	return Latency{P50: q(0.5), P90: q(0.9), P95: q(0.95), P99: q(0.99), Max: q(1)}
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
