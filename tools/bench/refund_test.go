package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden reports in testdata/ from what the code writes now")

// fakeRefund is a refund the fake API answered, and what the fake bank holds of it.
type fakeRefund struct {
	id, paymentID, key string
	amount             int64
	bank               int // refunds at the fake bank under this reference
}

// refundRoutes adds the refund routes, the payment's GET and the simulator's refund count to
// the fake: refunds succeed at once, and a refund over what is left is a 409 as kasa answers it.
func (f *fakeAPI) refundRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/payments/{id}/refunds", func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Amount string }
		key, id := r.Header.Get("Idempotency-Key"), r.PathValue("id")
		if json.NewDecoder(r.Body).Decode(&in) != nil || key == "" {
			problem(w, 400, "invalid_request")
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		merchant := f.merchants[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if _, ok := f.payments[id]; !ok || f.payer[id] == "" || f.owner[f.payer[id]] != merchant {
			problem(w, 404, "not_found")
			return
		}
		if f.refundKeys[key] {
			problem(w, 409, "idempotency_key_in_use") // the generator never re-sends a refund
			return
		}
		f.refundKeys[key] = true
		amount := minorOf(in.Amount)
		switch {
		case f.payments[id] != "succeeded":
			problem(w, 409, "payment_not_refundable")
			return
		case amount <= 0 || f.refunded[id]+amount > f.amounts[id]:
			f.overRefunds++
			problem(w, 409, "refund_exceeds_refundable")
			return
		}
		rf := &fakeRefund{id: uuid.NewString(), paymentID: id, key: key, amount: amount, bank: 1}
		f.refunded[id] += amount
		f.refunds = append(f.refunds, rf)
		writeJSONBody(w, 201, f.refundResource(rf))
	})
	mux.HandleFunc("GET /v1/payments/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		writeJSONBody(w, 200, f.paymentResource(r.PathValue("id")))
	})
	mux.HandleFunc("GET /v1/payments/{id}/refunds", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		after := r.URL.Query().Get("starting_after")
		var page []map[string]any
		skipping := after != ""
		more := false
		for i := len(f.refunds) - 1; i >= 0; i-- { // newest first
			rf := f.refunds[i]
			if rf.paymentID != r.PathValue("id") {
				continue
			}
			if skipping {
				skipping = rf.id != after
				continue
			}
			if len(page) == limit {
				more = true
				break
			}
			page = append(page, f.refundResource(rf))
		}
		writeJSONBody(w, 200, map[string]any{"data": page, "has_more": more})
	})
	mux.HandleFunc("GET /_sim/refunds", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := 0
		for _, rf := range f.refunds {
			if rf.id == r.URL.Query().Get("reference") {
				n = rf.bank
			}
		}
		writeJSONBody(w, 200, map[string]any{"count": n, "refunds": []any{}, "pending": 0})
	})
}

func (f *fakeAPI) refundResource(rf *fakeRefund) map[string]any {
	return map[string]any{"id": rf.id, "payment_id": rf.paymentID, "status": "succeeded",
		"amount": fmt.Sprintf("%d.%02d", rf.amount/100, rf.amount%100), "currency": "TRY"}
}

// The pool hands out parts of the payments put in it, from many clients at once, never more of
// a payment than its amount, down to exactly its amount; and refunds only while the refunds so
// far are fewer than the share of the operations.
func TestRefundPoolNeverOverRefunds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		share   float64
		amounts []int64
	}{
		{"quarter parts", 0.5, []int64{100, 101, 4, 3, 1, 10_000, 9_999}},
		{"a tiny share", 0.05, []int64{400, 1_000}},
		{"more refunds asked than payments allow", 0.95, []int64{7, 8, 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := partPool{parts: refundParts}
			for i, a := range tc.amounts {
				p.add(fmt.Sprint(i), "key", a)
			}
			var mu sync.Mutex
			taken := map[string][]int64{}
			var ops, refunds int
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 500 {
						rf, ok := p.take(tc.share)
						mu.Lock()
						ops++
						if ok {
							refunds++
							require.Positive(t, rf.amount)
							require.Equal(t, "key", rf.apiKey)
							taken[rf.paymentID] = append(taken[rf.paymentID], rf.amount)
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			for i, a := range tc.amounts {
				parts := taken[fmt.Sprint(i)]
				var sum int64
				for _, x := range parts {
					sum += x
				}
				require.Equal(t, a, sum, "payment %d of %d refunded in full, not more: %v", i, a, parts)
				require.LessOrEqual(t, len(parts), refundParts, "a part is at least a quarter, the last what is left")
			}
			require.LessOrEqual(t, float64(refunds), tc.share*float64(ops)+1, "never more refunds than the share")
		})
	}
}

// A payment run with a refund mix refunds parts of the payments that succeeded earlier in the run,
// never more than is left of one (the fake answers 409 then), at the share asked; the refunds
// are counted apart from the payments, and the check finds each once at the bank and in its
// payment's amount_refunded, and says so when they are not.
func TestRefundMix(t *testing.T) {
	t.Parallel()
	f := newFakeAPI(time.Millisecond)
	mux := http.NewServeMux()
	mux.Handle("/", f.handler())
	f.refundRoutes(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	opts := Options{APIURL: srv.URL, AdminToken: "admin", Merchants: 3, Payers: 2, Concurrency: 4,
		Warmup: 100 * time.Millisecond, Duration: 700 * time.Millisecond, Insufficient: 0.1, RefundShare: 0.3}
	ctx := context.Background()
	fx, err := Setup(ctx, opts)
	require.NoError(t, err)
	res, err := Run(ctx, opts, fx)
	require.NoError(t, err)
	require.Zero(t, res.Errors, res.FirstError)
	require.NotNil(t, res.Refunds)
	rs := res.Refunds
	require.Equal(t, 0.3, rs.Share)
	require.Positive(t, rs.New)
	require.Equal(t, rs.New, res.Answers["refund 201 succeeded"], "every refund the fake took succeeded: %v", res.Answers)
	require.Equal(t, rs.Requests, rs.New)
	require.InDelta(t, 0.3, float64(rs.Requests)/float64(res.Requests), 0.06, "refunds of %d requests: %d", res.Requests, rs.Requests)
	require.InDelta(t, float64(rs.New)/0.7, rs.Rate, 0.01)
	require.Positive(t, rs.Latency.P50)
	require.GreaterOrEqual(t, rs.Latency.P99, rs.Latency.P50)
	require.Equal(t, res.Requests-rs.Requests, res.NewPayments, "without duplicates every other request is a new payment")
	for label := range res.Answers {
		require.NotContains(t, label, "refund_exceeds_refundable")
	}
	f.mu.Lock()
	require.Zero(t, f.overRefunds)
	require.Len(t, f.refunds, len(res.RefundsSeen), "every refund the fake made was seen, warmup included")
	for id, a := range f.refunded {
		require.LessOrEqual(t, a, f.amounts[id])
	}
	for _, st := range res.Payments {
		require.NotEqual(t, "", st)
	}
	for _, rf := range f.refunds {
		_, isPayment := res.Payments[rf.id]
		require.False(t, isPayment, "a refund is not a payment")
	}
	f.mu.Unlock()

	var v Verdict
	err = checkRefunds(ctx, srv.URL, srv.URL, res.RefundsSeen, refundParts-1, &v)
	require.NoError(t, err)
	require.Equal(t, len(res.RefundsSeen), v.RefundsChecked)
	require.Zero(t, v.RefundDoubles)
	require.Empty(t, v.RefundProblems)

	// A refund twice at the bank, one missing there, and a payment whose amount_refunded is off.
	f.mu.Lock()
	f.refunds[0].bank, f.refunds[1].bank = 2, 0
	f.skew[f.refunds[2].paymentID] = 1
	f.mu.Unlock()
	v = Verdict{}
	err = checkRefunds(ctx, srv.URL, srv.URL, res.RefundsSeen, 1, &v)
	require.NoError(t, err)
	require.Equal(t, 1, v.RefundDoubles)
	require.Len(t, v.RefundProblems, 3, "%q", v.RefundProblems)
	require.True(t, slices.ContainsFunc(v.RefundProblems, func(p string) bool { return strings.Contains(p, "amount_refunded") }), "%q", v.RefundProblems)
}

// A run's JSON with a refund mix: the refunds beside the payments, in the fields documented in
// docs/performance.md; a run without one has no refunds field at all.
func TestResultJSON(t *testing.T) {
	t.Parallel()
	plain, err := json.Marshal(sampleResult("payments", 10))
	require.NoError(t, err)
	require.NotContains(t, string(plain), "refund")

	mixed := sampleResult("payments", 10)
	mixed.Refunds = &RefundStats{Share: 0.2, Requests: 190, New: 188, Rate: 18.8, Latency: Latency{P50: 20.5, P90: 40, P95: 45, P99: 60.25, Max: 90}}
	got, err := json.MarshalIndent(mixed, "", "  ")
	require.NoError(t, err)
	golden(t, "result_refunds.golden.json", append(got, '\n'))
}

// golden compares got with testdata/name; go test ./bench -run <test> -update rewrites it.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "no golden file: go test ./bench -run %s -update", t.Name())
	require.Equal(t, string(want), string(got))
}

func TestMarkdownRefunds(t *testing.T) {
	t.Parallel()
	require.NotContains(t, Markdown("kasa bench", sampleResult("payments", 10)), "refunds/s", "no refund table without a mix")
	mixed := sampleResult("payments", 10)
	mixed.Refunds = &RefundStats{Share: 0.2, Requests: 190, New: 188, Rate: 18.8, Latency: Latency{P50: 20.5, P90: 40, P95: 45, P99: 60.25, Max: 90}}
	out := Markdown("kasa bench", sampleResult("/healthz", 3), mixed)
	require.Contains(t, out, "| # | refund share | new payments/s | refunds/s | refund requests | refund p50 ms | refund p90 ms | refund p99 ms | refund max ms |")
	require.Contains(t, out, "| 2 | 0.20 | 90.0 | 18.8 | 190 | 20.50 | 40.00 | 60.25 | 90.00 |")
	require.NotContains(t, out, "| 1 | 0.")
}

// A suite's and a kept run's report say how many refunds were checked, name each refund problem
// (a failed verdict), and put the refund mix's refunds/s beside its payments/s.
func TestReportsOfARefundMix(t *testing.T) {
	t.Parallel()
	mixed := sampleResult(RunRefundMix+" (payments)", 15)
	mixed.Refunds = &RefundStats{Share: 0.2, Requests: 190, New: 188, Rate: 12.5, Latency: Latency{P50: 20.5, P99: 60.25}}
	failed := Verdict{Checked: 900, RefundsChecked: 188, RefundDoubles: 1,
		RefundProblems: []string{"refund r1 of payment p1: succeeded in kasa, refunded 2 times at the bank"}}
	for name, md := range map[string]string{
		"suite": SuiteMarkdown(&Report{Verdict: failed, Runs: []Result{sampleResult("run", 2), mixed}}),
		"run":   RunMarkdown(RunReport{Verdict: failed, Header: Header{Options: Options{RefundShare: 0.2}}, Run: mixed}, Markdown("kasa bench", mixed)),
	} {
		require.Contains(t, md, "Correctness: **FAILED**: 0 double charge(s), 1 double refund(s), 1 refund mismatch(es), 0 invariant violation(s) (900 payments and 188 refunds checked at the bank simulator).", name)
		require.Contains(t, md, "\n- refund r1 of payment p1: succeeded in kasa, refunded 2 times at the bank\n\n", name)
		require.Regexp(t, `\n\| [12] \| 0\.20 \| 90\.0 \| 12\.5 \| 190 \| 20\.50 \|`, md, name)
	}
	suite := SuiteMarkdown(&Report{Verdict: Verdict{Correct: true, Checked: 5, RefundsChecked: 2}, Runs: []Result{mixed}})
	require.Contains(t, suite, "Correctness: **correct**: no payment was charged twice, no refund refunded twice or missing, and `kasa verify` found no problem (5 payments and 2 refunds checked at the bank simulator).")
	require.Contains(t, suite, "Refunds: payments with refunds (payments) ran 12.5 refunds/s beside 90.0 new payments/s (a share of 0.20 of its operations; refund p50 20.5 ms, p99 60.2 ms).")

	got, err := json.MarshalIndent(failed, "", "  ")
	require.NoError(t, err)
	golden(t, "verdict_refunds.golden.json", append(got, '\n'))
}
