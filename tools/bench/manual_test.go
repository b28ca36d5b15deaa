package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeAuth is a manual payment's authorization: what kasa says it captured, and what the fake
// bank holds of it.
type fakeAuth struct {
	captured     int64 // kasa's amount_captured
	auths        int   // authorizations at the bank
	bankCaptured int64
	voided       bool
}

// manualRoutes adds the capture and cancel routes and the simulator's authorizations to the
// fake: commands finish at once, and one kasa would refuse is a 409 as kasa answers it.
func (f *fakeAPI) manualRoutes(mux *http.ServeMux) {
	command := func(kind string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var in struct{ Amount string }
			key, id := r.Header.Get("Idempotency-Key"), r.PathValue("id")
			if key == "" || (kind == kindCapture && json.NewDecoder(r.Body).Decode(&in) != nil) || (kind == kindCancel && r.ContentLength > 0) {
				problem(w, 400, "invalid_request")
				return
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			merchant := f.merchants[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
			if _, ok := f.payments[id]; !ok || f.owner[f.payer[id]] != merchant {
				problem(w, 404, "not_found")
				return
			}
			if f.commandKeys[key] {
				problem(w, 409, "idempotency_key_in_use") // the generator never re-sends a command
				return
			}
			f.commandKeys[key] = true
			a, amount := f.manual[id], minorOf(in.Amount)
			switch {
			case a == nil || f.payments[id] != "requires_capture":
				f.badCommands++
				problem(w, 409, map[string]string{kindCapture: "payment_not_capturable", kindCancel: "payment_not_cancelable"}[kind])
			case kind == kindCapture && (amount <= 0 || amount > f.amounts[id]):
				f.badCommands++
				problem(w, 409, "capture_exceeds_capturable")
			case kind == kindCapture:
				a.captured, a.bankCaptured, f.payments[id] = amount, amount, "succeeded"
				f.accounts[f.payer[id]] += f.amounts[id] - amount
				writeJSONBody(w, 201, f.paymentResource(id))
			default:
				a.voided, f.payments[id] = true, "canceled"
				f.accounts[f.payer[id]] += f.amounts[id]
				writeJSONBody(w, 200, f.paymentResource(id))
			}
		}
	}
	mux.HandleFunc("POST /v1/payments/{id}/capture", command(kindCapture))
	mux.HandleFunc("POST /v1/payments/{id}/cancel", command(kindCancel))
	mux.HandleFunc("GET /_sim/authorizations", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		a := f.manual[r.URL.Query().Get("reference")]
		if a == nil {
			a = &fakeAuth{}
		}
		writeJSONBody(w, 200, map[string]any{"count": a.auths, "captured_minor": a.bankCaptured, "voided": a.voided, "authorizations": []any{}, "pending": 0})
	})
}

// The pool hands out each authorization once and whole, from many clients at once, whenever one
// is open; and a command captures 1 minor unit up to all of it three times in four, else cancels.
func TestManualPoolAndCommands(t *testing.T) {
	t.Parallel()
	p := partPool{parts: 1}
	amounts := map[string]int64{}
	for i := range 50 {
		amounts[fmt.Sprint(i)] = int64(1 + i*37)
		p.add(fmt.Sprint(i), "key", int64(1+i*37))
	}
	var mu sync.Mutex
	taken := map[string]int64{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				if auth, ok := p.take(1); ok {
					mu.Lock()
					_, twice := taken[auth.paymentID]
					require.False(t, twice, auth.paymentID)
					taken[auth.paymentID] = auth.amount
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, amounts, taken, "every authorization once, whole")
	_, ok := p.take(1)
	require.False(t, ok, "none left")

	r := newRunner(Options{APIURL: "http://kasa", ManualShare: 0.5}, nil)
	const n = 4000
	captures, keys, whole := 0, map[string]bool{}, 0
	for range n {
		req := r.newCommand(pooled{paymentID: "p1", apiKey: "sk", amount: 300})
		require.Equal(t, "http://kasa/v1/payments/p1/"+req.kind, req.url)
		require.Equal(t, "sk", req.token)
		require.Equal(t, "p1", req.of)
		require.True(t, req.isNew)
		keys[req.key] = true
		if req.kind == kindCancel {
			require.Nil(t, req.body, "a cancel sends no body")
			continue
		}
		require.Equal(t, kindCapture, req.kind)
		captures++
		var body struct{ Amount string }
		require.NoError(t, json.Unmarshal(req.body, &body))
		a := minorOf(body.Amount)
		require.True(t, a >= 1 && a <= 300, body.Amount)
		if a == 300 {
			whole++
		}
	}
	require.Len(t, keys, n, "each under a key of its own")
	require.InDelta(t, 0.75, float64(captures)/n, 0.04)
	require.Positive(t, whole, "a capture may take all")
	require.Less(t, whole, captures/10, "most take a part")
}

// A payment run with a manual mix creates that share of its new payments with capture manual,
// and captures or cancels each one authorized, once, under its own key, never as kasa would
// refuse (the fake answers 409 then); the commands are counted apart from the payments, and the
// check finds each manual payment at the bank as kasa says, and says so when it is not.
func TestManualMix(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(time.Millisecond)
	mux := http.NewServeMux()
	mux.Handle("/", f.handler())
	f.refundRoutes(mux)
	f.manualRoutes(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	opts := Options{APIURL: srv.URL, AdminToken: "admin", Merchants: 3, Payers: 2, Concurrency: 4,
		Warmup: 100 * time.Millisecond, Duration: 700 * time.Millisecond, Insufficient: 0.1, Duplicates: 0.1, ManualShare: 0.3}
	ctx := context.Background()
	fx, err := Setup(ctx, opts)
	require.NoError(t, err)
	res, err := Run(ctx, opts, fx)
	require.NoError(t, err)
	require.Zero(t, res.Errors, res.FirstError)
	require.Nil(t, res.Refunds)
	ms := res.Manual
	require.NotNil(t, ms)
	require.Equal(t, 0.3, ms.Share)
	require.InDelta(t, 0.3, float64(ms.Authorizations)/float64(res.NewPayments), 0.12, "%d of %d", ms.Authorizations, res.NewPayments)
	require.Positive(t, ms.Captures, "%+v", *ms)
	require.Positive(t, ms.Cancels, "%+v", *ms)
	require.Equal(t, ms.Captures, res.Answers["capture 201 succeeded"], "%v", res.Answers)
	require.Equal(t, ms.Cancels, res.Answers["cancel 200 canceled"], "%v", res.Answers)
	require.Equal(t, ms.Commands, ms.Captures+ms.Cancels)
	// Three in four commands are captures (measured to ±0.04 over 4,000 above): here, over a
	// short run's few commands, within four standard deviations of that.
	require.InDelta(t, 0.75, float64(ms.Captures)/float64(ms.Commands), 4*math.Sqrt(0.75*0.25/float64(ms.Commands)))
	require.InDelta(t, float64(ms.Captures)/0.7, ms.CaptureRate, 0.01)
	require.InDelta(t, float64(ms.Cancels)/0.7, ms.CancelRate, 0.01)
	require.Positive(t, ms.Latency.P50, "%+v", *ms)
	require.Positive(t, ms.PaymentLatency.P50, "%+v", *ms)
	require.GreaterOrEqual(t, ms.Latency.P99, ms.Latency.P50)
	n, per := operations(res)
	require.Equal(t, res.NewPayments+ms.Captures+ms.Cancels, n, "CPU and counters per operation")
	require.Equal(t, "new payment or capture/cancel", per)
	n, per = operations(Result{NewPayments: 5, Refunds: &RefundStats{New: 2}, Manual: &ManualStats{Cancels: 1}})
	require.Equal(t, int64(8), n)
	require.Equal(t, "new payment, refund or capture/cancel", per)

	f.mu.Lock()
	require.Zero(t, f.badCommands, "no command kasa would refuse: each authorization once, within its amount")
	var manual, waiting, partial int
	for id, a := range f.manual {
		_, seen := res.ManualSeen[id]
		require.True(t, seen, "every manual payment the fake made was seen, warmup included")
		manual++
		switch f.payments[id] {
		case "requires_capture":
			waiting++
		case "succeeded":
			require.True(t, a.captured >= 1 && a.captured <= f.amounts[id])
			if a.captured < f.amounts[id] {
				partial++
			}
		}
		require.Equal(t, f.payments[id], res.Payments[id], "a payment's latest status, its command's included")
	}
	require.Len(t, res.ManualSeen, manual, "and no automatic one")
	require.LessOrEqual(t, waiting, opts.Concurrency, "a client takes an authorization before a new payment: only the last ones wait")
	require.Positive(t, partial, "some captures take a part")
	f.mu.Unlock()

	var v Verdict
	err = checkManual(ctx, srv.URL, srv.URL, res.ManualSeen, time.Second, &v)
	require.NoError(t, err)
	require.Equal(t, len(res.ManualSeen), v.ManualChecked)
	require.Zero(t, v.DoubleAuthorizations)
	require.Empty(t, v.ManualProblems)

	// Two authorizations at the bank, a bank capture other than kasa's, a canceled payment the
	// bank captured, a succeeded one it voided; and a capture that stays in flight past the wait
	// while another settles within it.
	var succeeded, canceled []string
	for id, m := range res.ManualSeen {
		switch res.Payments[id] {
		case "succeeded":
			succeeded = append(succeeded, id)
		case "canceled":
			canceled = append(canceled, id)
		}
		require.Equal(t, map[string]string{"succeeded": kindCapture, "canceled": kindCancel}[res.Payments[id]], m.Command, id)
	}
	require.GreaterOrEqual(t, len(succeeded), 5)
	require.NotEmpty(t, canceled)
	f.mu.Lock()
	f.manual[succeeded[0]].auths = 2
	f.manual[succeeded[1]].bankCaptured++
	f.manual[canceled[0]].bankCaptured = 1
	f.manual[succeeded[2]].voided = true
	f.payments[succeeded[3]], f.payments[succeeded[4]] = "requires_capture", "requires_capture"
	f.mu.Unlock()
	time.AfterFunc(300*time.Millisecond, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.payments[succeeded[4]] = "succeeded"
	})
	start := time.Now()
	v = Verdict{}
	err = checkManual(ctx, srv.URL, srv.URL, res.ManualSeen, time.Second, &v)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), time.Second, "waited for the capture in flight")
	require.Equal(t, 1, v.DoubleAuthorizations)
	require.Len(t, v.ManualProblems, 5, "%q", v.ManualProblems)
	problems := strings.Join(v.ManualProblems, "\n")
	for _, want := range []string{
		"manual payment " + succeeded[0] + ": succeeded in kasa", "2 authorizations at the bank",
		"manual payment " + canceled[0] + ": canceled in kasa", "canceled, yet captured at the bank",
		"succeeded, yet voided at the bank", "still requires_capture 1s after the run and its capture",
	} {
		require.Contains(t, problems, want)
	}
	require.NotContains(t, problems, succeeded[4])
}

// A run's JSON with a manual mix, and the reports: the manual mix beside the suite's automatic
// payments, its commands in the runs' table, and its check in the verdict.
func TestReportsOfAManualMix(t *testing.T) {
	t.Parallel()
	mixed := sampleResult(RunManualMix+" (payments)", 15)
	mixed.Manual = &ManualStats{Share: 0.2, Authorizations: 170, Commands: 160, Captures: 120, Cancels: 40, CaptureRate: 8, CancelRate: 2.5,
		Latency: Latency{P50: 30.5, P90: 50, P95: 55, P99: 70.25, Max: 95}, PaymentLatency: Latency{P50: 14, P90: 31, P95: 40, P99: 81, Max: 300}}
	got, err := json.MarshalIndent(mixed, "", "  ")
	require.NoError(t, err)
	golden(t, "result_manual.golden.json", append(got, '\n'))
	plain, err := json.Marshal(sampleResult("payments", 10))
	require.NoError(t, err)
	require.NotContains(t, string(plain), "manual")

	spread := sampleResult(RunSpread+" #2 (payments)", 15)
	spread.NewPaymentRate = 95
	good := Verdict{Correct: true, Checked: 900, ManualChecked: 170}
	suite := SuiteMarkdown(&Report{Verdict: good, Runs: []Result{sampleResult(RunSpread+" #1 (payments)", 15), spread, mixed}})
	require.Contains(t, suite, "Correctness: **correct**: no payment was charged twice, no refund refunded twice or missing, no manual payment authorized twice or captured otherwise than kasa says, and `kasa verify` found no problem (900 payments, 170 manual payments and 0 refunds checked at the bank simulator).")
	require.Contains(t, suite, "Manual capture: payments with manual capture (payments) ran 90.0 new payments/s, a share of 0.20 of them authorized for a later capture (payment p50 14.0 ms, p99 81.0 ms), "+
		"beside 95.0 new payments/s, all captured at once, in payments, spread #2 (payments) (p50 12.5 ms, p99 80.2 ms); and 8.0 captures/s and 2.5 cancels/s (command p50 30.5 ms, p99 70.2 ms). "+
		"170 manual payments checked at the bank simulator and read back: 0 authorized twice, 0 mismatch(es).")
	require.Contains(t, suite, "| # | manual share | new payments/s | authorizations | payment p50 ms | payment p99 ms | captures/s | cancels/s | command requests | command p50 ms | command p90 ms | command p99 ms | command max ms |")
	require.Contains(t, suite, "| 3 | 0.20 | 90.0 | 170 | 14.00 | 81.00 | 8.0 | 2.5 | 160 | 30.50 | 50.00 | 70.25 | 95.00 |")
	require.NotContains(t, Markdown("kasa bench", spread), "manual share", "no manual table without a mix")

	failed := Verdict{Checked: 900, ManualChecked: 170, DoubleAuthorizations: 1,
		ManualProblems: []string{"manual payment p1: succeeded in kasa, amount 10.00, amount_captured 5.00: 2 authorizations at the bank"}}
	run := RunMarkdown(RunReport{Verdict: failed, Header: Header{Options: Options{ManualShare: 0.2}}, Run: mixed}, Markdown("kasa bench", mixed))
	require.Contains(t, run, "Correctness: **FAILED**: 0 double charge(s), 0 double refund(s), 0 refund mismatch(es), 1 double authorization(s), 1 manual payment mismatch(es), 0 invariant violation(s) (900 payments, 170 manual payments and 0 refunds checked at the bank simulator).")
	require.Contains(t, run, "\n- manual payment p1: succeeded in kasa, amount 10.00, amount_captured 5.00: 2 authorizations at the bank\n\n")
	require.Contains(t, run, "refund share 0.00, manual share 0.20.")
}
