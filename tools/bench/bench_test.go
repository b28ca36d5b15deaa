package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// fakeAPI is a small in-memory stand-in for kasa's admin and payment API (docs/openapi.yaml): enough
// to drive the generator and check what it sent.
type fakeAPI struct {
	delay time.Duration // time a new payment stays processing

	mu        sync.Mutex
	merchants map[string]string // api key -> merchant id
	accounts  map[string]int64  // account id -> balance (minor units)
	owner     map[string]string // account id -> merchant id
	deposits  map[string]int64  // idempotency key -> amount
	records   map[string]*fakeRecord
	payments  map[string]string // payment id -> status
	invoices  map[string]bool
	charged   []int64 // amounts of the payments that succeeded

	amounts     map[string]int64  // payment id -> amount
	payer       map[string]string // payment id -> account id
	refunded    map[string]int64  // payment id -> sum of its refunds
	skew        map[string]int64  // payment id -> added to amount_refunded in its GET (a broken kasa)
	refunds     []*fakeRefund
	refundKeys  map[string]bool
	overRefunds int // refunds asked for more than was left

	manual      map[string]*fakeAuth // manual payment id -> its authorization
	commandKeys map[string]bool
	badCommands int // captures and cancels kasa would refuse (409)
}

type fakeRecord struct {
	body   string
	done   bool
	status int
	answer []byte
}

func newFakeAPI(delay time.Duration) *fakeAPI {
	return &fakeAPI{
		delay: delay, merchants: map[string]string{}, accounts: map[string]int64{}, owner: map[string]string{},
		deposits: map[string]int64{}, records: map[string]*fakeRecord{}, payments: map[string]string{}, invoices: map[string]bool{},
		amounts: map[string]int64{}, payer: map[string]string{}, refunded: map[string]int64{}, skew: map[string]int64{}, refundKeys: map[string]bool{},
		manual: map[string]*fakeAuth{}, commandKeys: map[string]bool{},
	}
}

func (f *fakeAPI) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, `{"status":"ok"}`) })
	mux.HandleFunc("POST /admin/v1/merchants", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer admin" {
			problem(w, 401, "unauthorized")
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		id, key := uuid.NewString(), "sk_"+uuid.NewString()
		f.merchants[key] = id
		writeJSONBody(w, 201, map[string]string{"id": id, "name": "x", "api_key": key, "webhook_secret": "s"})
	})
	mux.HandleFunc("POST /admin/v1/accounts", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			MerchantID string `json:"merchant_id"`
			Currency   string `json:"currency"`
		}
		if json.NewDecoder(r.Body).Decode(&in) != nil || in.Currency != "TRY" {
			problem(w, 400, "invalid_request")
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		id := uuid.NewString()
		f.accounts[id], f.owner[id] = 0, in.MerchantID
		writeJSONBody(w, 201, map[string]string{"id": id, "currency": in.Currency})
	})
	mux.HandleFunc("POST /admin/v1/accounts/{id}/deposits", func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Amount string }
		key := r.Header.Get("Idempotency-Key")
		if json.NewDecoder(r.Body).Decode(&in) != nil || key == "" {
			problem(w, 400, "invalid_request")
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		amount := minorOf(in.Amount)
		f.accounts[r.PathValue("id")] += amount
		f.deposits[key] = amount
		writeJSONBody(w, 201, map[string]string{"id": uuid.NewString(), "amount": in.Amount})
	})
	mux.HandleFunc("POST /v1/payments", f.payment)
	return mux
}

func (f *fakeAPI) payment(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var in struct {
		InvoiceID string `json:"invoice_id"`
		Amount    string `json:"amount"`
		Currency  string `json:"currency"`
		AccountID string `json:"account_id"`
		Capture   string `json:"capture"`
	}
	key := r.Header.Get("Idempotency-Key")
	if json.Unmarshal(raw, &in) != nil || key == "" || r.Header.Get("Content-Type") != "application/json" {
		problem(w, 400, "invalid_request")
		return
	}
	f.mu.Lock()
	merchant, ok := f.merchants[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
	if !ok || f.owner[in.AccountID] != merchant {
		f.mu.Unlock()
		problem(w, 401, "unauthorized")
		return
	}
	if found, ok := f.records[merchant+"/"+key]; ok {
		rec := *found
		f.mu.Unlock()
		switch {
		case rec.body != string(raw):
			problem(w, 422, "idempotency_key_reused")
		case !rec.done:
			problem(w, 409, "idempotency_key_in_use")
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(rec.status)
			w.Write(rec.answer)
		}
		return
	}
	if f.invoices[in.InvoiceID] {
		f.mu.Unlock()
		problem(w, 409, "duplicate_payment")
		return
	}
	rec := &fakeRecord{body: string(raw)}
	f.records[merchant+"/"+key], f.invoices[in.InvoiceID] = rec, true
	f.mu.Unlock()

	time.Sleep(f.delay)

	f.mu.Lock()
	defer f.mu.Unlock()
	amount := minorOf(in.Amount)
	id := uuid.NewString()
	p := map[string]any{"id": id, "status": "succeeded", "amount": in.Amount, "currency": in.Currency,
		"invoice_id": in.InvoiceID, "account_id": in.AccountID, "failure_code": nil}
	rec.status = 201
	switch {
	case amount > f.accounts[in.AccountID]:
		p["status"], p["failure_code"], rec.status = "failed", "insufficient_funds", 402
	case in.Capture == "manual":
		f.accounts[in.AccountID] -= amount // held
		f.manual[id] = &fakeAuth{auths: 1}
		p["status"] = "requires_capture"
	default:
		f.accounts[in.AccountID] -= amount
		f.charged = append(f.charged, amount)
	}
	if in.Capture == "manual" {
		if f.manual[id] == nil { // failed: no authorization at the bank
			f.manual[id] = &fakeAuth{}
		}
		p["capture"], p["capturable"], p["amount_captured"] = "manual", map[bool]string{true: in.Amount, false: "0.00"}[rec.status == 201], "0.00"
	}
	rec.answer, _ = json.Marshal(p)
	rec.done = true
	f.payments[id] = p["status"].(string)
	f.amounts[id], f.payer[id] = amount, in.AccountID
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rec.status)
	w.Write(rec.answer)
}

// paymentResource is a payment as the fake's GET answers it, with the fields of a manual one;
// callers hold mu.
func (f *fakeAPI) paymentResource(id string) map[string]any {
	money := func(minor int64) string { return fmt.Sprintf("%d.%02d", minor/100, minor%100) }
	p := map[string]any{"id": id, "status": f.payments[id], "amount": money(f.amounts[id]),
		"amount_refunded": money(f.refunded[id] + f.skew[id]), "currency": "TRY"}
	if a := f.manual[id]; a != nil {
		capturable := int64(0)
		if f.payments[id] == "requires_capture" {
			capturable = f.amounts[id]
		}
		p["capture"], p["capturable"], p["amount_captured"] = "manual", money(capturable), money(a.captured)
	}
	return p
}

func (f *fakeAPI) snapshot() (payments map[string]string, deposits map[string]int64, accounts int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	payments, deposits = map[string]string{}, map[string]int64{}
	for k, v := range f.payments {
		payments[k] = v
	}
	for k, v := range f.deposits {
		deposits[k] = v
	}
	return payments, deposits, len(f.accounts)
}

func problem(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"type": "https://kasa.dev/problems/" + code, "title": code, "status": status, "code": code})
}

func writeJSONBody(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// minorOf parses a TRY amount ("123.45") into minor units.
func minorOf(s string) int64 {
	n, err := strconv.ParseInt(strings.Replace(s, ".", "", 1), 10, 64)
	if err != nil || !strings.Contains(s, ".") || len(s)-strings.Index(s, ".") != 3 {
		return -1
	}
	return n
}

func TestClassify(t *testing.T) {
	t.Parallel()
	payment := func(status, failure string) string {
		fc := "null"
		if failure != "" {
			fc = strconv.Quote(failure)
		}
		return fmt.Sprintf(`{"id":"p1","status":%q,"amount":"10.00","currency":"TRY","failure_code":%s}`, status, fc)
	}
	problemBody := func(status int, code string) string {
		return fmt.Sprintf(`{"type":"https://kasa.dev/problems/%s","title":"t","status":%d,"detail":"d","code":%q,"payment_id":"p0"}`, code, status, code)
	}
	replayed := http.Header{"Idempotent-Replayed": {"true"}}
	tests := []struct {
		name     string
		code     int
		header   http.Header
		body     string
		label    string
		id       string
		status   string
		replayed bool
	}{
		{"succeeded", 201, nil, payment("succeeded", ""), "201 succeeded", "p1", "succeeded", false},
		{"insufficient funds", 402, nil, payment("failed", "insufficient_funds"), "402 insufficient_funds", "p1", "failed", false},
		{"declined", 402, nil, payment("failed", "declined"), "402 declined", "p1", "failed", false},
		{"processing", 202, nil, payment("processing", ""), "202 processing", "p1", "processing", false},
		{"unknown", 202, nil, payment("unknown", ""), "202 unknown", "p1", "unknown", false},
		{"replayed success", 201, replayed, payment("succeeded", ""), "201 replayed", "p1", "succeeded", true},
		{"replayed failure", 402, replayed, payment("failed", "insufficient_funds"), "402 replayed", "p1", "failed", true},
		{"key in use", 409, nil, problemBody(409, "idempotency_key_in_use"), "409 idempotency_key_in_use", "", "", false},
		{"duplicate payment", 409, nil, problemBody(409, "duplicate_payment"), "409 duplicate_payment", "", "", false},
		{"key reused", 422, nil, problemBody(422, "idempotency_key_reused"), "422 idempotency_key_reused", "", "", false},
		{"unavailable", 503, nil, problemBody(503, "unavailable"), "503 unavailable", "", "", false},
		{"plain text", 200, nil, "pong", "200", "", "", false},
		{"html error page", 502, nil, "<html>bad gateway</html>", "502", "", "", false},
		{"empty", 204, nil, "", "204", "", "", false},
		{"truncated json", 201, nil, `{"id":"p1","sta`, "201", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := tt.header
			if h == nil {
				h = http.Header{}
			}
			got := classify(tt.code, h, []byte(tt.body))
			require.Equal(t, answer{label: tt.label, paymentID: tt.id, status: tt.status, replayed: tt.replayed}, got)
		})
	}
}

func TestFormatAmount(t *testing.T) {
	t.Parallel()
	tests := []struct {
		minor    int64
		currency string
		want     string
	}{
		{12345, "TRY", "123.45"}, {5, "TRY", "0.05"}, {100, "TRY", "1.00"}, {100, "JPY", "100"}, {1, "KWD", "0.001"}, {1000, "KWD", "1.000"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, payment.FormatAmount(tt.minor, tt.currency), "%d %s", tt.minor, tt.currency)
	}
}

func TestSetupAndClosedLoop(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(2 * time.Millisecond)
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	opts := Options{
		APIURL: srv.URL, AdminToken: "admin", Merchants: 3, Payers: 2, Concurrency: 4,
		Warmup: 100 * time.Millisecond, Duration: 600 * time.Millisecond,
		Duplicates: 0.3, Insufficient: 0.2,
	}
	ctx := context.Background()
	fx, err := Setup(ctx, opts)
	require.NoError(t, err)
	require.Len(t, fx.Merchants, 3)
	_, deposits, accounts := f.snapshot()
	require.Equal(t, 6, accounts)
	require.Len(t, deposits, 6, "one deposit per payer, each under its own key")
	for _, amount := range deposits {
		require.Equal(t, int64(deposit), amount)
	}
	for _, m := range fx.Merchants {
		require.Len(t, m.Payers, 2)
		require.NotContains(t, m.Payers, "")
	}

	res, err := Run(ctx, opts, fx)
	require.NoError(t, err)
	require.Zero(t, res.Errors, res.FirstError)
	require.Equal(t, "closed", res.Mode)
	require.Positive(t, res.Requests)
	require.Positive(t, res.NewPayments)
	var answered int64
	for _, n := range res.Answers {
		answered += n
	}
	require.Equal(t, res.Requests, answered)
	for _, label := range []string{"201 succeeded", "402 insufficient_funds", "201 replayed", "409 idempotency_key_in_use"} {
		require.Positive(t, res.Answers[label], "no %q in %v", label, res.Answers)
	}
	require.InDelta(t, float64(res.Requests)/0.6, res.Throughput, 0.01)

	// Every payment the fake created was answered to the client, warmup included, with its status.
	created, _, _ := f.snapshot()
	require.Equal(t, created, res.Payments)

	// The payments that went through are for amounts within the range asked for, and span it.
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotEmpty(t, f.charged)
	require.GreaterOrEqual(t, slices.Min(f.charged), int64(minAmount))
	require.LessOrEqual(t, slices.Max(f.charged), int64(maxAmount))
	require.Less(t, slices.Min(f.charged), int64(2000))
	require.Greater(t, slices.Max(f.charged), int64(8000))
}

func TestReplayPath(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(0)
	srv := httptest.NewServer(f.handler())
	defer srv.Close()
	opts := Options{APIURL: srv.URL, AdminToken: "admin", Path: "replay", Concurrency: 4, Duration: 300 * time.Millisecond, Insufficient: 0.1}
	fx, err := Setup(context.Background(), opts)
	require.NoError(t, err)
	res, err := Run(context.Background(), opts, fx)
	require.NoError(t, err)
	require.Positive(t, res.Requests)
	require.Zero(t, res.NewPayments)
	for label := range res.Answers {
		require.True(t, strings.HasSuffix(label, " replayed"), label)
	}
	created, _, _ := f.snapshot()
	require.Len(t, created, replayPool, "the run itself creates nothing")
}

func TestRawPathAndTransportErrors(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(newFakeAPI(0).handler())
	res, err := Run(context.Background(), Options{APIURL: srv.URL, Path: "/healthz", Concurrency: 2, Duration: 200 * time.Millisecond}, nil)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"200 ok": res.Requests}, res.Answers)
	require.Positive(t, res.Requests)

	srv.Close() // nothing listens any more: every request is a transport error, and the run goes on
	res, err = Run(context.Background(), Options{APIURL: srv.URL, Path: "/healthz", Concurrency: 2, Duration: 200 * time.Millisecond}, nil)
	require.NoError(t, err)
	require.Zero(t, res.Requests)
	require.Positive(t, res.Errors)
	require.NotEmpty(t, res.FirstError)
}

func TestRunNeedsFixture(t *testing.T) {
	t.Parallel()
	_, err := Run(context.Background(), Options{APIURL: "http://127.0.0.1:1"}, nil)
	require.ErrorContains(t, err, "Fixture")
	_, err = Run(context.Background(), Options{APIURL: "http://127.0.0.1:1", Path: "nope"}, nil)
	require.ErrorContains(t, err, "unknown path")
}

// TestOpenLoopIntendedTime checks that latency counts from the scheduled arrival: a server that
// takes 50 ms, offered 100 arrivals/s with one client, serves 20/s; the queue builds and must show.
func TestOpenLoopIntendedTime(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(50 * time.Millisecond)
	}))
	t.Cleanup(srv.Close) // after the parallel subtests, not when this function returns
	tests := []struct {
		name                 string
		rate                 float64
		clients              int
		warmup               time.Duration
		wantRequests         int64 // -1: check requests+unsent instead
		minP50, maxP50       time.Duration
		minMax               time.Duration
		wantUnsent           bool
		requestsPlusUnsentIs int64
	}{
		// Arrival k is sent at ~50k ms but was due at 10k ms: latency 50 ms + 40k ms.
		{name: "overloaded", rate: 100, clients: 1, wantRequests: -1, minP50: 200 * time.Millisecond, maxP50: time.Second,
			minMax: 500 * time.Millisecond, wantUnsent: true, requestsPlusUnsentIs: 100},
		// 20/s with 8 clients never queues; arrivals before the 250 ms warmup are not recorded.
		{name: "under capacity", rate: 20, clients: 8, warmup: 250 * time.Millisecond, wantRequests: 20,
			minP50: 50 * time.Millisecond, maxP50: 150 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := Run(context.Background(), Options{
				APIURL: srv.URL, Path: "/slow", Rate: tt.rate, Concurrency: tt.clients, Warmup: tt.warmup, Duration: time.Second,
			}, nil)
			require.NoError(t, err)
			require.Equal(t, "open", res.Mode)
			require.Zero(t, res.Errors, res.FirstError)
			if tt.wantRequests >= 0 {
				require.Equal(t, tt.wantRequests, res.Requests)
			} else {
				require.InDelta(t, tt.requestsPlusUnsentIs, res.Requests+res.Unsent, 1)
			}
			require.Equal(t, tt.wantUnsent, res.Unsent > 0, "unsent %d", res.Unsent)
			p50 := time.Duration(res.Latency.P50 * float64(time.Millisecond))
			require.GreaterOrEqual(t, p50, tt.minP50)
			require.LessOrEqual(t, p50, tt.maxP50)
			require.GreaterOrEqual(t, time.Duration(res.Latency.Max*float64(time.Millisecond)), tt.minMax)
		})
	}
}

func TestRunStopsWithContext(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(newFakeAPI(0).handler())
	defer srv.Close()
	// A second: long enough for requests to finish on a loaded machine, far from the minute asked.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	res, err := Run(ctx, Options{APIURL: srv.URL, Path: "/healthz", Duration: time.Minute}, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Less(t, res.Duration, 3.0)
	require.Positive(t, res.Requests)
	require.Zero(t, res.Errors)
}

func TestCheckCharges(t *testing.T) {
	t.Parallel()
	counts := map[string]int{"a": 1, "b": 2, "c": 0, "d": 3, "e": 1}
	sim := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, ok := counts[r.URL.Query().Get("reference")]
		if r.URL.Path != "/_sim/charges" || !ok {
			http.Error(w, "no", http.StatusInternalServerError)
			return
		}
		writeJSONBody(w, 200, map[string]any{"count": n, "charges": []any{}})
	}))
	defer sim.Close()
	doubles, err := CheckCharges(context.Background(), sim.URL+"/", []string{"a", "b", "c", "d", "e"})
	require.NoError(t, err)
	require.Equal(t, 2, doubles)
	_, err = CheckCharges(context.Background(), sim.URL, []string{"a", "missing"})
	require.ErrorContains(t, err, "missing")
}
