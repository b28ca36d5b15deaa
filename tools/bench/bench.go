// Package bench measures kasa: an HTTP load generator over the REST API (docs/openapi.yaml),
// closed loop (clients back to back) or open loop (arrivals on a schedule, latency counted from
// the intended send time: no coordinated omission), the ceilings it is held to, and the suite.
package bench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/procfs"
	"golang.org/x/sync/errgroup"

	"github.com/kasa-pay/kasa/payment"
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
	// Path: "payments" (default, POST /v1/payments), "replay" (re-sends of finished payments only),
	// or a raw path such as "/healthz" (GET without auth).
	Path     string                           `json:",omitempty"`
	Preload  int                              // RunSuite: stored payments for the large-table runs; 0 skips them
	CPU      CPU                              `json:"-"` // if set, a run reports the CPU its measured window cost, by process class
	Counters Counters                         `json:"-"` // if set, a run reports how much each counter grew per operation over its window
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
	// Payments maps every payment id seen in an answer (warmup included) to its latest status,
	// for the charge counts at the simulator. Kept out of the JSON: it can be large.
	Payments map[string]string `json:"-"`
	// RefundsSeen maps every refund id seen in an answer (warmup included) to its payment, for
	// the refund check. Kept out of the JSON as Payments is.
	RefundsSeen map[string]RefundOf `json:"-"`
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
	o.Path = orDefault(o.Path, "payments")
	o.Duration, o.Concurrency = orDefault(o.Duration, 10*time.Second), orDefault(o.Concurrency, 16)
	o.Merchants, o.Payers = max(o.Merchants, 1), max(o.Payers, 1)
	if o.Path != "payments" && o.Path != "replay" && !strings.HasPrefix(o.Path, "/") {
		return o, fmt.Errorf("bench: unknown path %q (payments, replay or /raw/path)", o.Path)
	}
	if o.RefundShare < 0 || o.RefundShare >= 1 || (o.RefundShare > 0 && o.Path != "payments") {
		return o, fmt.Errorf("bench: refund share %v: from 0 to below 1, on path payments only", o.RefundShare)
	}
	return o, nil
}

// orDefault is v, or def when v is not positive (or empty).
func orDefault[T int | time.Duration | string](v, def T) T {
	var zero T
	if v <= zero {
		return def
	}
	return v
}

// newClient returns one client for a whole run: HTTP/1.1 keep-alive with enough idle connections
// that no client dials again after its first request.
func newClient(conns int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil // measure kasa, not a proxy picked up from the environment
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
	refundOf                string // a refund's payment id
}

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
	req, err := http.NewRequestWithContext(ctx, r.method, r.url, bytes.NewReader(r.body))
	if err != nil {
		return outcome{err: err}
	}
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.key != "" {
		req.Header.Set("Idempotency-Key", r.key)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body) // read to EOF so the connection is reused
	}
	if err != nil {
		return outcome{err: err}
	}
	return outcome{ans: classify(resp.StatusCode, resp.Header, b), code: resp.StatusCode, body: b}
}

// runner is one run: its options, and what its clients recorded (under mu).
type runner struct {
	opts                 Options
	fx                   *Fixture
	hc                   *http.Client
	pool                 []request // replay path: finished payments
	start, measured, end time.Time
	op                   func(context.Context) outcome // if set, what a client does instead of HTTP requests

	refunds refundPool // with a refund mix: the payments to refund

	mu        sync.Mutex
	res       Result          // the answers, errors, new payments and payments seen
	lat       []time.Duration // of the requests sent in the window
	refundLat []time.Duration // of the refund requests among them
}

func newRunner(opts Options, fx *Fixture) *runner {
	r := &runner{opts: opts, fx: fx, res: Result{Answers: map[string]int64{}, Payments: map[string]string{}, RefundsSeen: map[string]RefundOf{}}}
	if opts.RefundShare > 0 {
		r.res.Refunds = &RefundStats{}
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
	slices.Sort(r.lat)
	res.Duration, res.Requests = window.Seconds(), int64(len(r.lat))
	if window > 0 {
		res.Throughput, res.NewPaymentRate = float64(res.Requests)/window.Seconds(), float64(res.NewPayments)/window.Seconds()
	}
	res.Latency = latencyOf(r.lat)
	if o.RefundShare > 0 {
		slices.Sort(r.refundLat)
		rs := res.Refunds
		rs.Share, rs.Requests, rs.Latency = o.RefundShare, int64(len(r.refundLat)), latencyOf(r.refundLat)
		if window > 0 {
			rs.Rate = float64(rs.New) / window.Seconds()
		}
	}
	per, ops := "request", res.Requests
	switch {
	case r.op != nil:
		per = "workflow"
		res.NewPayments, res.NewPaymentRate = res.Requests, res.Throughput
	case res.Refunds != nil && res.Refunds.New > 0:
		per, ops = "new payment or refund", res.NewPayments+res.Refunds.New
	case res.NewPayments > 0:
		per, ops = "new payment", res.NewPayments
	}
	res.CPU = cpuUse(used, o.Duration, per, ops)
	if len(counted) > 0 && ops > 0 {
		res.PerOp = map[string]float64{}
		for name, n := range counted {
			res.PerOp[name] = float64(n) / float64(ops)
		}
	}
	return res, ctx.Err()
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
	if req.refundOf != "" {
		o.ans.label = "refund " + o.ans.label
	}
	// A payment that succeeded under its first request becomes refundable (once: a twin or a
	// retry is not its first request).
	if r.opts.RefundShare > 0 && req.isNew && req.refundOf == "" && o.ans.status == "succeeded" && !o.ans.replayed {
		r.refunds.add(o.ans.paymentID, req.token, req.amount)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch id := o.ans.paymentID; {
	case id == "":
	case req.refundOf != "":
		seen := r.res.RefundsSeen[id]
		seen.PaymentID, seen.APIKey = req.refundOf, req.token
		if seen.Status == "" || o.ans.status != "processing" {
			seen.Status = o.ans.status
		}
		r.res.RefundsSeen[id] = seen
	default:
		notePayment(r.res.Payments, id, o.ans.status)
	}
	if intended.Before(r.measured) || !intended.Before(r.end) {
		return o.err == nil
	}
	if o.err != nil {
		r.res.Errors++
		r.res.FirstError = orDefault(r.res.FirstError, o.err.Error())
		return false
	}
	r.lat = append(r.lat, o.done.Sub(intended))
	r.res.Answers[o.ans.label]++
	switch {
	case req.refundOf != "":
		r.refundLat = append(r.refundLat, o.done.Sub(intended))
		if o.ans.paymentID != "" && !o.ans.replayed {
			r.res.Refunds.New++
		}
	case req.isNew && o.ans.paymentID != "" && !o.ans.replayed:
		r.res.NewPayments++
	}
	return true
}

// notePayment keeps a payment's most final status: a later "processing" never hides an outcome.
func notePayment(m map[string]string, id, status string) {
	if old, ok := m[id]; !ok || old == "processing" {
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
	body, _ := json.Marshal(map[string]string{"invoice_id": key, "amount": payment.FormatAmount(amount, currency),
		"currency": currency, "account_id": m.Payers[rand.IntN(len(m.Payers))]})
	return request{method: http.MethodPost, url: r.opts.APIURL + "/v1/payments", token: m.APIKey, key: key, body: body, isNew: true, amount: amount}
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

// latencyOf is the quantiles of sorted latencies.
func latencyOf(sorted []time.Duration) Latency {
	q := func(q float64) float64 { return ms(quantile(sorted, q)) }
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

// Fixture is what Setup created: the merchants, their API keys and funded payer accounts.
type Fixture struct{ Merchants []Merchant }

// Merchant is one benchmark merchant. All its payments credit its one settlement account, which
// makes that account a hot row: more merchants spread the load.
type Merchant struct {
	ID     string
	APIKey string   `json:"api_key"`
	Payers []string // payer account ids
}

const (
	// deposit, in every payer account, affords 100,000 maximal payments: far more than any run
	// here sends, so only Insufficient fails.
	deposit       = maxAmount * 100_000
	setupParallel = 32 // concurrent admin calls; Setup of 1000 merchants takes seconds
)

// Setup creates opts.Merchants merchants with opts.Payers funded payer accounts each (admin API).
func Setup(ctx context.Context, opts Options) (*Fixture, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	hc := newClient(setupParallel)
	defer hc.CloseIdleConnections()
	fx := &Fixture{Merchants: make([]Merchant, opts.Merchants)}
	admin := func(ctx context.Context, path, key string, in map[string]string, out any) error {
		body, _ := json.Marshal(in)
		r := request{method: http.MethodPost, url: opts.APIURL + "/admin/v1" + path, token: opts.AdminToken, key: key, body: body}
		return call(ctx, hc, r, out)
	}
	err = parallel(ctx, opts.Merchants, setupParallel, func(ctx context.Context, i int) error {
		fx.Merchants[i].Payers = make([]string, opts.Payers)
		return admin(ctx, "/merchants", "", map[string]string{"name": fmt.Sprintf("bench-%d", i)}, &fx.Merchants[i])
	})
	if err != nil {
		return nil, err
	}
	amount := payment.FormatAmount(deposit, currency)
	err = parallel(ctx, opts.Merchants*opts.Payers, setupParallel, func(ctx context.Context, i int) error {
		m := &fx.Merchants[i/opts.Payers]
		var acct struct{ ID string }
		if err := admin(ctx, "/accounts", "", map[string]string{"merchant_id": m.ID, "currency": currency}, &acct); err != nil {
			return err
		}
		m.Payers[i%opts.Payers] = acct.ID
		return admin(ctx, "/accounts/"+acct.ID+"/deposits", uuid.NewString(), map[string]string{"amount": amount}, nil)
	})
	return fx, err
}

// CheckCharges asks the bank simulator how many of the payments were charged more than once.
func CheckCharges(ctx context.Context, simURL string, ids []string) (doubles int, err error) {
	hc := newClient(16)
	defer hc.CloseIdleConnections()
	base := strings.TrimRight(simURL, "/") + "/_sim/charges?reference="
	var n atomic.Int64
	err = parallel(ctx, len(ids), 16, func(ctx context.Context, i int) error {
		var out struct{ Count *int }
		if err := call(ctx, hc, request{method: http.MethodGet, url: base + url.QueryEscape(ids[i])}, &out); err != nil {
			return fmt.Errorf("bench: charges of %s: %w", ids[i], err)
		}
		if out.Count == nil {
			return fmt.Errorf("bench: charges of %s: answer without count", ids[i])
		}
		if *out.Count > 1 {
			n.Add(1)
		}
		return nil
	})
	return int(n.Load()), err
}

// call sends r and decodes a 2xx JSON answer into out; anything else is an error quoting the body.
func call(ctx context.Context, hc *http.Client, r request, out any) error {
	o := send(ctx, hc, r)
	switch {
	case o.err != nil:
		return o.err
	case o.code/100 != 2:
		return fmt.Errorf("%s %s: %d: %s", r.method, r.url, o.code, strings.TrimSpace(string(o.body)))
	case out == nil:
		return nil
	}
	return json.Unmarshal(o.body, out)
}

// parallel calls fn for 0..n-1 on at most workers goroutines and stops at the first error.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i := range n {
		g.Go(func() error { return fn(ctx, i) })
	}
	return g.Wait()
}

// CPU reads how much CPU time each class of a stack's processes has used so far.
type CPU func() map[string]time.Duration

// Counters reads counters that only grow, such as a database's commits; nil or an error
// leaves a sample out.
type Counters func(ctx context.Context) (map[string]int64, error)

// The process classes CPU reports; any other process of the stack is named by its executable.
const (
	ClassKasa     = "kasa"     // kasa's processes: the measured kasa dev (API, worker, relay, consumer, embedded NATS), or kasa cluster's
	ClassBanksim  = "banksim"  // the bank simulator (kasa banksim), a process of its own: not kasa
	ClassPostgres = "postgres" // PostgreSQL's server processes
	ClassTemporal = "temporal" // the Temporal dev server
	ClassBench    = "bench"    // this process: the load generator, and in a T run its worker
)

// Parts of ClassPostgres's time, not classes: the CPU of the backends connected to kasa's database
// and of those connected to any other (Temporal's, the bench's own counters). What no backend used
// (the postmaster, WAL writer, checkpointer, closed backends) is PostgreSQL's shared time.
const (
	postgresKasa   = "postgres@kasa"
	postgresOthers = "postgres@others"
	partPrefix     = "postgres@"
)

// StackCPU reads from /proc the CPU time of root (class kasa), of every process descended from it
// (PostgreSQL, Temporal), of the beside processes and their descendants (servers started for
// root rather than by it), and of this process (class bench). A process's time includes its ended
// children (PostgreSQL's closed backends), except for this process's: pgbench is not the load
// generator. If kasaBackends is set, it maps PostgreSQL backends' process ids to whether they
// serve kasa's database, and their time is also counted in the parts postgres@kasa and
// postgres@others. Nil where there is no /proc.
func StackCPU(root int, beside []int, kasaBackends func() map[int]bool) CPU {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return nil
	}
	self := os.Getpid()
	const tick = 10 * time.Millisecond // USER_HZ, the unit of /proc's CPU times
	return func() map[string]time.Duration {
		var backends map[int]bool
		if kasaBackends != nil {
			backends = kasaBackends()
		}
		procs := readProcs()
		use := map[string]time.Duration{}
		for pid, p := range procs {
			st := p.ProcStat
			own, children := time.Duration(st.UTime+st.STime)*tick, time.Duration(st.CUTime+st.CSTime)*tick
			switch {
			case pid == self:
				use[ClassBench] += own
			case pid == root:
				use[ClassKasa] += own + children
			case descends(procs, pid, root) || slices.ContainsFunc(beside, func(b int) bool { return pid == b || descends(procs, pid, b) }):
				use[class(st.Comm, p.args)] += own + children
				if kasa, ok := backends[pid]; ok {
					use[map[bool]string{true: postgresKasa, false: postgresOthers}[kasa]] += own + children
				}
			}
		}
		return use
	}
}

// class is the process class of an executable's name and arguments: the real Temporal Server
// counts as Temporal, kasa's bank simulator as the simulator, and kasa's other commands as kasa
// (whatever the binary is called: kasa, kasa.wt...).
func class(comm string, args []string) string {
	switch {
	case comm == "temporal-server":
		return ClassTemporal
	case isKasa(comm) && len(args) > 1 && args[1] == "banksim":
		return ClassBanksim
	case isKasa(comm):
		return ClassKasa
	}
	return comm
}

func isKasa(comm string) bool { return strings.HasPrefix(comm, "kasa") }

// proc is a process's stat, and its arguments when its class depends on them.
type proc struct {
	procfs.ProcStat
	args []string
}

// readProcs reads every process's stat. Processes that end while it reads are left out.
func readProcs() map[int]proc {
	all, _ := procfs.AllProcs()
	procs := make(map[int]proc, len(all))
	for _, p := range all {
		if st, err := p.Stat(); err == nil {
			var args []string
			if isKasa(st.Comm) {
				args, _ = p.CmdLine()
			}
			procs[p.PID] = proc{st, args}
		}
	}
	return procs
}

// descends says whether pid is a descendant of root.
func descends(stats map[int]proc, pid, root int) bool {
	for range 64 { // a process tree is shallow; a cycle would be a bug in /proc, not a loop here
		st, ok := stats[pid]
		if !ok || st.PPID <= 1 {
			return false
		}
		if st.PPID == root {
			return true
		}
		pid = st.PPID
	}
	return false
}

// sampleBetween samples cpu and counters at from and at to, and gives each class's CPU time and
// each counter's growth between the two; nil for what is nil, failed, or when ctx ends first.
func sampleBetween(ctx context.Context, cpu CPU, counters Counters, from, to time.Time) (map[string]time.Duration, map[string]int64) {
	if (cpu == nil && counters == nil) || sleep(ctx, time.Until(from)) != nil {
		return nil, nil
	}
	count := func() map[string]int64 {
		if counters == nil {
			return nil
		}
		c, err := counters(ctx)
		if err != nil {
			return nil
		}
		return c
	}
	now := func() map[string]time.Duration {
		if cpu == nil {
			return nil
		}
		return cpu()
	}
	a, ca := now(), count()
	if sleep(ctx, time.Until(to)) != nil {
		return nil, nil
	}
	used, grew := map[string]time.Duration{}, map[string]int64{}
	for class, t := range now() {
		if d := t - a[class]; d > 0 {
			used[class] = d
		}
	}
	if cb := count(); ca != nil && cb != nil {
		for name, n := range cb {
			grew[name] = n - ca[name]
		}
	}
	return used, grew
}

// CPUUse is the CPU a run's window cost, by process class.
type CPUUse struct {
	Per   string             `json:"per"`   // the operation: "new payment", "workflow" or "request"
	MS    map[string]float64 `json:"ms"`    // CPU milliseconds per operation, by process class
	Cores float64            `json:"cores"` // all classes together: cores busy on average over the window
	// PostgresBackends splits part of MS["postgres"] by the database the backends served
	// ("kasa", "others"); the rest is PostgreSQL's shared time. Absent without that split.
	PostgresBackends map[string]float64 `json:"postgres_backends_ms,omitempty"`
	Own              OwnCPU             `json:"kasa_own"`
}

// OwnTarget is the most kasa's own CPU per payment may be, as a share of Temporal's.
const OwnTarget = 0.5

// OwnCPU is kasa's own CPU per operation: kasa's processes (ClassKasa, and a NATS server of the
// stack) and kasa's part of PostgreSQL; never Temporal, the bank simulator or the load generator.
// Kasa's part of PostgreSQL is its backends' time and the shared time in the proportion of its
// backends' to all backends' (all of PostgreSQL's time without a split by database).
type OwnCPU struct {
	MS       float64 `json:"ms"`          // kasa's own CPU milliseconds per operation
	Postgres float64 `json:"postgres_ms"` // of which kasa's part of PostgreSQL
	Ratio    float64 `json:"to_temporal"` // MS ÷ Temporal's milliseconds per operation; 0 without Temporal
	Target   float64 `json:"target"`      // OwnTarget
	Met      bool    `json:"met"`         // Ratio ≤ Target, with Temporal measured
}

// cpuUse divides the window's CPU among its operations; nil without a measurement or operations.
func cpuUse(used map[string]time.Duration, window time.Duration, per string, ops int64) *CPUUse {
	if len(used) == 0 || ops <= 0 || window <= 0 {
		return nil
	}
	u := &CPUUse{Per: per, MS: map[string]float64{}}
	perOp := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(ops) }
	var total time.Duration
	for class, d := range used {
		if part, ok := strings.CutPrefix(class, partPrefix); ok {
			if u.PostgresBackends == nil {
				u.PostgresBackends = map[string]float64{}
			}
			u.PostgresBackends[part] = perOp(d)
			continue
		}
		u.MS[class] = perOp(d)
		total += d
	}
	u.Cores = total.Seconds() / window.Seconds()
	pg := u.MS[ClassPostgres]
	if b := u.PostgresBackends; b != nil {
		kasa, backends := b["kasa"], b["kasa"]+b["others"]
		pg = kasa
		if backends > 0 {
			pg += max(u.MS[ClassPostgres]-backends, 0) * kasa / backends
		}
	}
	u.Own = OwnCPU{MS: u.MS[ClassKasa] + u.MS["nats-server"] + pg, Postgres: pg, Target: OwnTarget}
	if t := u.MS[ClassTemporal]; t > 0 {
		u.Own.Ratio = u.Own.MS / t
		u.Own.Met = u.Own.Ratio <= OwnTarget
	}
	return u
}
