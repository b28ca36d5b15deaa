package api

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/serviceerror"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

var update = flag.Bool("update", false, "rewrite the golden answers in testdata/ from what the handlers answer now")

// A payment request of merchant A, and the same key's request with another amount.
const (
	payBody      = `{"invoice_id":"inv-1","amount":"10.00","currency":"TRY","account_id":"0192f1f0-0000-7000-8000-0000000000a1"}`
	otherPayBody = `{"invoice_id":"inv-1","amount":"20.00","currency":"TRY","account_id":"0192f1f0-0000-7000-8000-0000000000a1"}`
)

// goldenHeaders are the headers an answer is compared on (with its status and body).
var goldenHeaders = []string{"Content-Type", "Location", "Retry-After", "Idempotent-Replayed", "WWW-Authenticate", "X-Request-Id"}

// request is one HTTP request of a case. Unless header says otherwise it carries merchant A's
// key (the admin token under /admin), a JSON content type when it has a body, a fixed request
// id, and for POST /v1/payments the Idempotency-Key "k1". A header set to "" is left out.
type request struct {
	method, path string
	header       map[string]string
	body         string
}

func (r request) build() *http.Request {
	method, path := r.method, r.path
	if method == "" {
		method, path = http.MethodPost, "/v1/payments"
	}
	req := httptest.NewRequest(method, path, strings.NewReader(r.body))
	h := map[string]string{"Authorization": "Bearer sk_a", "X-Request-Id": "req-1"}
	if strings.HasPrefix(path, "/admin/") {
		h["Authorization"] = "Bearer adm"
	}
	if r.body != "" {
		h["Content-Type"] = "application/json"
	}
	if method == http.MethodPost && path == "/v1/payments" {
		h["Idempotency-Key"] = "k1"
	}
	if method == http.MethodPost && strings.HasPrefix(path, "/v1/payments/") && strings.HasSuffix(path, "/refunds") {
		h["Idempotency-Key"] = "r1"
	}
	if method == http.MethodPost && (strings.HasSuffix(path, "/capture") || strings.HasSuffix(path, "/cancel")) {
		h["Idempotency-Key"] = "c1"
	}
	for k, v := range r.header {
		h[k] = v
	}
	for k, v := range h {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	return req
}

// fixture is a case's server and its fakes.
type fixture struct {
	st     *fakeStore
	wf     *fakeWorkflows
	opts   Options
	reconc *parseOnly
}

// seed records a payment of merchant A under key, as an earlier request left it: processing
// (workflow started unless lease is set), or with status as its outcome.
func (f *fixture) seed(key, body string, status payment.Status, lease time.Time) store.Record {
	req, err := payment.ParseRequest([]byte(body))
	if err != nil {
		panic(err)
	}
	f.st.mu.Lock()
	rec, p, _, err := f.st.begin(store.BeginInput{MerchantID: merchantA, Key: key, Request: req}, lease)
	if err != nil {
		panic(err)
	}
	if lease.IsZero() {
		rec.WorkflowStarted = true
		f.st.records[recordKey{merchantA, key}] = rec
	}
	f.st.mu.Unlock()
	if status != payment.StatusProcessing {
		f.st.finish(p.ID, status)
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	return f.st.records[recordKey{merchantA, key}]
}

// seedQueued records a payment of merchant A under key, queued in the start backlog.
func (f *fixture) seedQueued(key, body string) {
	req, err := payment.ParseRequest([]byte(body))
	if err != nil {
		panic(err)
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	if _, _, _, err := f.st.begin(store.BeginInput{MerchantID: merchantA, Key: key, Request: req, Queue: true}, time.Time{}); err != nil {
		panic(err)
	}
}

// seedUnsaved records key k1's payment with outcome status and a completed record without
// its answer, as records completed before answers were stored are.
func (f *fixture) seedUnsaved(status payment.Status) {
	rec := f.seed("k1", payBody, status, time.Time{})
	rec.Outcome, rec.ResponseBody = "", nil
	f.st.records[recordKey{merchantA, "k1"}] = rec
}

// seedRefund records a refund of payment under key, as an earlier request left it: processing
// (workflow started unless lease is set), or with status as its outcome.
func (f *fixture) seedRefund(key string, paymentID uuid.UUID, body string, status payment.Status, lease time.Time) {
	req, err := payment.ParseRefundRequest([]byte(body))
	if err != nil {
		panic(err)
	}
	f.st.mu.Lock()
	rec, r, _, err := f.st.beginRefund(store.BeginRefundInput{MerchantID: merchantA, PaymentID: paymentID, Key: key, Request: req}, lease)
	if err != nil {
		panic(err)
	}
	if lease.IsZero() {
		rec.WorkflowStarted = true
		f.st.refundRecords[recordKey{merchantA, key}] = rec
	}
	f.st.mu.Unlock()
	if status != payment.StatusProcessing {
		f.st.finishRefund(r.ID, status)
	}
}

// paid seeds merchant A's succeeded payment of 10.00, fakeID(1), to refund.
func (f *fixture) paid() { f.seed("k1", payBody, payment.StatusSucceeded, time.Time{}) }

// authorized records key k1's payment as a manual one waiting for its capture, whose window ends
// an hour from now (the fixture's creation time is fixed in the past).
func (f *fixture) authorized() {
	f.seed("k1", payBody, payment.StatusRequiresCapture, time.Time{})
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	p := f.st.payments[fakeID(1)]
	p.CaptureManual, p.CaptureBefore = true, time.Now().Add(time.Hour)
	f.st.payments[p.ID] = p
}

// commitBefore leaves the request's operation processing at the sync wait's end, then has the
// worker commit it, succeeded, just before the store's next call named call (a refund's read,
// Refund or RefundRecord, or a payment's); with expire, retention then deletes its record.
func (f *fixture) commitBefore(call string, expire bool) {
	f.wf.outcome = ""
	refund := strings.HasPrefix(call, "Refund")
	f.st.before[call] = func() {
		records := f.st.records
		if refund {
			records = f.st.refundRecords
			for id := range f.st.refunds {
				f.st.finishRefund(id, payment.StatusSucceeded)
			}
		} else {
			for id := range f.st.payments {
				f.st.finish(id, payment.StatusSucceeded)
			}
		}
		if expire {
			f.st.mu.Lock()
			clear(records)
			f.st.mu.Unlock()
		}
	}
}

// keyUsedAgain has another payment (or refund) under key k1 (r1), failed, made just before the store's next call
// named call runs (after commitBefore's hook, set first): a request after the record expired.
func (f *fixture) keyUsedAgain(call string) {
	hook := f.st.before[call]
	f.st.before[call] = func() {
		hook()
		if strings.HasPrefix(call, "Refund") {
			f.seedRefund("r1", fakeID(1), otherRefundBody, payment.StatusFailed, time.Time{})
			return
		}
		f.seed("k1", `{"invoice_id":"inv-2","amount":"20.00","currency":"TRY","account_id":"0192f1f0-0000-7000-8000-0000000000a1"}`,
			payment.StatusFailed, time.Time{})
	}
}

// Refund requests of the payment fakeID(1), and their paths.
var (
	refundsPath     = "/v1/payments/" + fakeID(1).String() + "/refunds"
	capturePath     = "/v1/payments/" + fakeID(1).String() + "/capture"
	cancelPath      = "/v1/payments/" + fakeID(1).String() + "/cancel"
	refundBody      = `{"amount":"3.00","reason":"damaged in transit"}`
	otherRefundBody = `{"amount":"4.00","reason":"damaged in transit"}`
)

type handlerCase struct {
	name   string
	before []request // sent first; their answers are not compared
	req    request
	setup  func(f *fixture)
	check  func(t *testing.T, f *fixture) // effects beyond the answer
}

// handlerCases are every answer the payment table can give, every problem code, and the other
// routes' answers. Each case's answer is testdata/<name>.golden.
var handlerCases = []handlerCase{
	// POST /v1/payments: a new key.
	{name: "payment_succeeded_201", req: request{body: payBody}},
	{name: "payment_failed_402", req: request{body: payBody},
		setup: func(f *fixture) { f.wf.outcome = payment.StatusFailed }},
	{name: "payment_succeeded_announced_201", req: request{body: payBody},
		setup: func(f *fixture) { f.opts.Outcomes = f.st },
		check: func(t *testing.T, f *fixture) {
			require.Zero(t, f.st.calls["Record"], "an announced answer needs no read")
		}},
	{name: "payment_processing_202", req: request{body: payBody},
		setup: func(f *fixture) { f.wf.outcome = "" }},
	{name: "payment_final_after_its_record_was_read_201", req: request{body: payBody},
		// The sync wait ends with the record processing; the worker commits before the payment
		// is read. That commit completed the record: its stored answer goes out.
		setup: func(f *fixture) { f.commitBefore("Payment", false) }},
	{name: "payment_record_expired_before_the_answer_201", req: request{body: payBody},
		// With a retention of seconds, the worker commits and retention deletes the completed
		// record before the first answer goes out: it is the payment's answer, not a 404.
		setup: func(f *fixture) { f.commitBefore("Record", true) }},
	{name: "payment_record_expired_and_its_key_used_again_before_the_answer_201", req: request{body: payBody},
		// The same, and a request with the key then made another payment, failed: the first
		// request's answer is still its own payment's, never the other's.
		setup: func(f *fixture) { f.commitBefore("Record", true); f.keyUsedAgain("Record") }},
	{name: "payment_unknown_202", req: request{body: payBody},
		setup: func(f *fixture) { f.wf.outcome = payment.StatusUnknown }},
	{name: "payment_unknown_announced_202", req: request{body: payBody},
		setup: func(f *fixture) { f.wf.outcome, f.opts.Outcomes = payment.StatusUnknown, f.st }},
	// POST /v1/payments: a key seen before.
	{name: "replay_succeeded_201", req: request{body: payBody},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusSucceeded, time.Time{}) },
		check: func(t *testing.T, f *fixture) { require.Zero(t, f.wf.starts, "a replay executes nothing") }},
	{name: "replay_failed_402", req: request{body: payBody},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusFailed, time.Time{}) }},
	{name: "replay_equivalent_request_201", req: request{body: `{"account_id":"0192f1f0-0000-7000-8000-0000000000a1","currency":"try","amount":10,"invoice_id":"inv-1","payment_type":"purchase"}`},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusSucceeded, time.Time{}) }},
	{name: "replay_unsaved_answer_201", req: request{body: payBody},
		setup: func(f *fixture) { f.seedUnsaved(payment.StatusSucceeded) },
		check: func(t *testing.T, f *fixture) { require.Equal(t, 1, f.st.calls["SaveResponse"]) }},
	{name: "replay_unsaved_answer_402", req: request{body: payBody},
		setup: func(f *fixture) { f.seedUnsaved(payment.StatusFailed) }},
	{name: "replay_from_memory_201", before: []request{{body: payBody}, {body: payBody}}, req: request{body: payBody},
		setup: func(f *fixture) { f.opts.ReplayCache = 10 },
		check: func(t *testing.T, f *fixture) {
			require.Equal(t, 2, f.st.calls["Begin"], "the third request is answered from memory")
		}},
	{name: "replay_unknown_202", req: request{body: payBody},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusUnknown, time.Time{}) }},
	{name: "replay_unknown_final_since_201", req: request{body: payBody},
		// The retry reads the record unknown; a settlement completes the payment before it is
		// read: the stored answer goes out as the replay it is.
		setup: func(f *fixture) {
			f.seed("k1", payBody, payment.StatusUnknown, time.Time{})
			f.commitBefore("Payment", false)
		}},
	{name: "replay_unknown_final_since_expired_201", req: request{body: payBody},
		// The same, with retention deleting the completed record before it is read again.
		setup: func(f *fixture) {
			f.seed("k1", payBody, payment.StatusUnknown, time.Time{})
			f.commitBefore("Payment", true)
		}},
	{name: "replay_processing_409", req: request{body: payBody},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusProcessing, time.Time{}) }},
	{name: "replay_leased_409", req: request{body: payBody},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusProcessing, time.Now().Add(time.Hour)) }},
	{name: "replay_lease_expired_taken_over_201", req: request{body: payBody},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusProcessing, time.Now().Add(-time.Second)) },
		check: func(t *testing.T, f *fixture) { require.Equal(t, 1, f.wf.starts, "the retry starts the workflow") }},
	// The lease is the database's (it stamped locked_until): a retry on a host whose clock runs
	// behind it takes over once the database says the lease ran out, not minutes later.
	{name: "replay_lease_expired_by_the_databases_clock_taken_over_201", req: request{body: payBody},
		setup: func(f *fixture) {
			f.st.skew = 2 * time.Minute
			f.seed("k1", payBody, payment.StatusProcessing, time.Now().Add(time.Minute))
		},
		check: func(t *testing.T, f *fixture) { require.Equal(t, 1, f.wf.starts, "the retry starts the workflow") }},
	// ...and a host whose clock runs ahead of it takes over nothing the database still leases.
	{name: "replay_leased_by_the_databases_clock_409", req: request{body: payBody},
		setup: func(f *fixture) {
			f.st.skew = -2 * time.Minute
			f.seed("k1", payBody, payment.StatusProcessing, time.Now().Add(-time.Minute))
		},
		check: func(t *testing.T, f *fixture) { require.Zero(t, f.wf.starts, "the lease holder may still start it") }},
	{name: "replay_queued_409", req: request{body: payBody},
		// Queued in the start backlog: the drainer starts it in its turn, never a retry, which
		// is asked to come back when the backlog ahead of it may have drained (300 at 10/s).
		setup: func(f *fixture) {
			f.opts.Backlog = Backlog{State: fakeBacklog{state: store.BacklogState{Queued: 300, DrainPerSecond: 10, Age: time.Second}}, MaxRunning: 8}
			f.seedQueued("k1", payBody)
		},
		check: func(t *testing.T, f *fixture) {
			require.Zero(t, f.wf.starts)
			require.Zero(t, f.st.calls["TakeOver"], "a queued payment is not taken over")
		}},
	{name: "reused_key_422", req: request{body: payBody},
		setup: func(f *fixture) { f.seed("k1", otherPayBody, payment.StatusSucceeded, time.Time{}) }},
	{name: "duplicate_payment_409", req: request{body: payBody, header: map[string]string{"Idempotency-Key": "k2"}},
		setup: func(f *fixture) { f.seed("k1", otherPayBody, payment.StatusSucceeded, time.Time{}) }},
	// POST /v1/payments: a burst (docs/operations.md, "Payday").
	{name: "payment_queued_behind_the_merchants_backlog_202", req: request{body: payBody},
		// The merchant has a payment queued: a new one queues behind it, answered at once.
		setup: func(f *fixture) {
			f.opts.Backlog = Backlog{State: fakeBacklog{state: store.BacklogState{Queued: 25, DrainPerSecond: 10}}, MaxRunning: 8}
			f.seedQueued("k0", strings.Replace(payBody, "inv-1", "inv-0", 1))
		},
		check: func(t *testing.T, f *fixture) {
			require.Zero(t, f.wf.starts, "the drainer starts it")
			require.True(t, f.st.records[recordKey{merchantA, "k1"}].Queued)
		}},
	{name: "backlog_full_503", req: request{body: payBody},
		// The merchant has payments queued: a new one would queue behind them.
		setup: func(f *fixture) {
			f.opts.Backlog = Backlog{State: fakeBacklog{state: store.BacklogState{Queued: 1000, DrainPerSecond: 50}, queued: map[uuid.UUID]bool{merchantA: true}},
				MaxRunning: 8, MaxQueued: 1000}
		},
		check: func(t *testing.T, f *fixture) {
			require.Zero(t, f.st.calls["Begin"], "nothing is written")
			require.Empty(t, f.st.payments)
		}},
	{name: "backlog_too_long_to_drain_503", req: request{body: payBody},
		setup: func(f *fixture) {
			f.opts.Backlog = Backlog{State: fakeBacklog{state: store.BacklogState{Queued: 700, DrainPerSecond: 10}, queued: map[uuid.UUID]bool{merchantA: true}},
				MaxRunning: 8, MaxWait: time.Minute}
		},
		check: func(t *testing.T, f *fixture) { require.Empty(t, f.st.payments) }},
	{name: "backlog_full_replay_201", req: request{body: payBody},
		// Past the bound a key seen before still gets its answer.
		setup: func(f *fixture) {
			f.opts.Backlog = Backlog{State: fakeBacklog{state: store.BacklogState{Queued: 1000}, queued: map[uuid.UUID]bool{merchantA: true}}, MaxRunning: 8, MaxQueued: 1000}
			f.seed("k1", payBody, payment.StatusSucceeded, time.Time{})
		}},
	// POST /v1/payments: rejected before anything is written, in the order they are checked.
	{name: "unauthorized_no_key_401", req: request{body: payBody, header: map[string]string{"Authorization": ""}}},
	{name: "unauthorized_wrong_key_401", req: request{body: payBody, header: map[string]string{"Authorization": "Bearer sk_nobody"}}},
	{name: "idempotency_key_missing_400", req: request{body: payBody, header: map[string]string{"Idempotency-Key": ""}}},
	{name: "idempotency_key_invalid_400", req: request{body: payBody, header: map[string]string{"Idempotency-Key": "has space"}}},
	{name: "unsupported_media_type_415", req: request{body: payBody, header: map[string]string{"Content-Type": "text/plain"}}},
	{name: "body_too_large_413", req: request{body: `{"invoice_id":"` + strings.Repeat("x", payment.MaxBodyBytes) + `"}`}},
	{name: "invalid_body_400", req: request{body: `{"invoice_id":"inv 1","amount":"10.001","currency":"XXX","extra":1}`}},
	{name: "invalid_json_400", req: request{body: `[1,2]`}},
	{name: "not_my_account_400", req: request{body: strings.Replace(payBody, "0000000000a1", "0000000000b1", 1)}},
	{name: "currency_mismatch_400", req: request{body: strings.Replace(payBody, "TRY", "EUR", 1)}},
	// POST /v1/payments: a dependency fails.
	{name: "database_unavailable_503", req: request{body: payBody},
		setup: func(f *fixture) { f.st.fail["Begin"] = fmt.Errorf("begin: %w", payment.ErrUnavailable) }},
	{name: "serialization_conflict_503", req: request{body: payBody},
		setup: func(f *fixture) { f.st.fail["Begin"] = store.ErrConflict }},
	{name: "workflow_start_failed_503", req: request{body: payBody},
		setup: func(f *fixture) { f.wf.startErr = serviceerror.NewUnavailable("frontend down") },
		check: func(t *testing.T, f *fixture) {
			require.Equal(t, 1, f.st.calls["ExpireLease"], "the next retry may take over at once")
		}},
	{name: "internal_error_500", req: request{body: payBody},
		setup: func(f *fixture) {
			f.st.fail["Begin"] = errors.New("relation payments: disk full at /var/lib/postgresql")
		}},
	{name: "panic_500", req: request{body: payBody},
		setup: func(f *fixture) { f.st.fail["Begin"] = errPanicNow }},

	// POST /v1/payments/{id}/refunds: a new key.
	{name: "refund_succeeded_201", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid() },
		check: func(t *testing.T, f *fixture) {
			require.EqualValues(t, 300, f.st.payments[fakeID(1)].AmountRefunded)
			require.Equal(t, 1, f.wf.starts)
		}},
	{name: "refund_whole_remainder_201", before: []request{{method: "POST", path: refundsPath, body: refundBody, header: map[string]string{"Idempotency-Key": "r0"}}},
		req:   request{method: "POST", path: refundsPath, body: `{}`},
		setup: func(f *fixture) { f.paid() },
		check: func(t *testing.T, f *fixture) { require.EqualValues(t, 1000, f.st.payments[fakeID(1)].AmountRefunded) }},
	{name: "refund_failed_402", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid(); f.wf.outcome = payment.StatusFailed },
		check: func(t *testing.T, f *fixture) { require.Zero(t, f.st.held[fakeID(1)], "the hold is released") }},
	{name: "refund_succeeded_announced_201", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid(); f.opts.Outcomes = f.st },
		check: func(t *testing.T, f *fixture) {
			require.Zero(t, f.st.calls["RefundRecord"], "an announced answer needs no read")
		}},
	{name: "refund_processing_202", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid(); f.wf.outcome = "" }},
	{name: "refund_final_after_its_record_was_read_201", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid(); f.commitBefore("Refund", false) }},
	{name: "refund_record_expired_before_the_answer_201", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid(); f.commitBefore("RefundRecord", true) }},
	{name: "refund_record_expired_and_its_key_used_again_before_the_answer_201", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid(); f.commitBefore("RefundRecord", true); f.keyUsedAgain("RefundRecord") }},
	{name: "refund_unknown_202", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid(); f.wf.outcome = payment.StatusUnknown },
		check: func(t *testing.T, f *fixture) {
			require.EqualValues(t, 300, f.st.held[fakeID(1)], "an unknown refund keeps its hold")
		}},
	// POST /v1/payments/{id}/refunds: a key seen before.
	{name: "refund_replay_201", before: []request{{method: "POST", path: refundsPath, body: refundBody}},
		req:   request{method: "POST", path: refundsPath, body: `{"reason":"damaged in transit","amount":3}`},
		setup: func(f *fixture) { f.paid() },
		check: func(t *testing.T, f *fixture) {
			require.Equal(t, 1, f.wf.starts, "a replay executes nothing")
			require.Len(t, f.st.refunds, 1)
		}},
	{name: "refund_replay_failed_402", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusFailed, time.Time{})
		}},
	{name: "refund_replay_after_full_refund_201", before: []request{{method: "POST", path: refundsPath, body: `{}`, header: map[string]string{"Idempotency-Key": "r2"}}},
		req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusSucceeded, time.Time{})
		}},
	{name: "refund_replay_from_memory_201", before: []request{{method: "POST", path: refundsPath, body: refundBody}, {method: "POST", path: refundsPath, body: refundBody}},
		req:   request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid(); f.opts.ReplayCache = 10 },
		check: func(t *testing.T, f *fixture) {
			require.Equal(t, 2, f.st.calls["BeginRefund"], "the third request is answered from memory")
		}},
	// The payment's key r1, answered from memory, is not the refund's key r1.
	{name: "refund_key_of_a_payment_201",
		before: []request{{body: payBody, header: map[string]string{"Idempotency-Key": "r1"}}, {body: payBody, header: map[string]string{"Idempotency-Key": "r1"}}},
		req:    request{method: "POST", path: refundsPath, body: refundBody},
		setup:  func(f *fixture) { f.opts.ReplayCache = 10 },
		check: func(t *testing.T, f *fixture) {
			require.Len(t, f.st.refunds, 1)
			require.Equal(t, 2, f.wf.starts, "the payment's and the refund's")
		}},
	{name: "refund_unknown_replay_202", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusUnknown, time.Time{})
		}},
	{name: "refund_unknown_final_since_replay_201", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusUnknown, time.Time{})
			f.commitBefore("Refund", false)
		}},
	{name: "refund_in_use_409", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusProcessing, time.Time{})
		}},
	{name: "refund_lease_expired_taken_over_201", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusProcessing, time.Now().Add(-time.Second))
		},
		check: func(t *testing.T, f *fixture) {
			require.Equal(t, 1, f.wf.starts, "the retry starts the workflow")
			require.Equal(t, 1, f.st.calls["TakeOverRefund"])
		}},
	{name: "refund_reused_key_422", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), otherRefundBody, payment.StatusSucceeded, time.Time{})
		}},
	{name: "refund_reused_key_other_payment_422", req: request{method: "POST", path: "/v1/payments/" + fakeID(3).String() + "/refunds", body: refundBody},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusSucceeded, time.Time{})
			f.seed("k3", strings.Replace(payBody, "inv-1", "inv-3", 1), payment.StatusSucceeded, time.Time{})
		}},
	// POST /v1/payments/{id}/refunds: refused, nothing kept.
	{name: "refund_key_missing_400", req: request{method: "POST", path: refundsPath, body: refundBody, header: map[string]string{"Idempotency-Key": ""}}},
	{name: "refund_key_invalid_400", req: request{method: "POST", path: refundsPath, body: refundBody, header: map[string]string{"Idempotency-Key": "has space"}}},
	{name: "refund_payment_not_refundable_409", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusFailed, time.Time{}) },
		check: func(t *testing.T, f *fixture) { require.Empty(t, f.st.refundRecords, "nothing kept") }},
	{name: "refund_exceeds_refundable_409", before: []request{{method: "POST", path: refundsPath, body: `{}`, header: map[string]string{"Idempotency-Key": "r0"}}},
		req:   request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid() },
		check: func(t *testing.T, f *fixture) { require.Len(t, f.st.refundRecords, 1, "nothing kept") }},
	// Captures and cancels: the refusals the payment's row decides (the rest: tests/capture_test.go).
	{name: "capture_payment_not_capturable_409", req: request{method: "POST", path: capturePath, body: `{}`},
		setup: func(f *fixture) { f.paid() }},
	{name: "cancel_payment_not_cancelable_409", req: request{method: "POST", path: cancelPath},
		setup: func(f *fixture) { f.paid() }},
	{name: "capture_exceeds_capturable_409", req: request{method: "POST", path: capturePath, body: `{"amount":"10.01"}`},
		setup: func(f *fixture) { f.authorized() }},
	{name: "capture_too_many_decimals_400", req: request{method: "POST", path: capturePath, body: `{"amount":"1.001"}`},
		setup: func(f *fixture) { f.authorized() }},
	{name: "refund_exceeds_amount_409", req: request{method: "POST", path: refundsPath, body: `{"amount":"10.01"}`},
		setup: func(f *fixture) { f.paid() }},
	{name: "refund_other_merchant_payment_404", req: request{method: "POST", path: refundsPath, body: refundBody, header: map[string]string{"Authorization": "Bearer sk_b"}},
		setup: func(f *fixture) { f.paid() },
		check: func(t *testing.T, f *fixture) { require.Zero(t, f.wf.starts) }},
	{name: "refund_unknown_payment_404", req: request{method: "POST", path: "/v1/payments/" + fakeID(99).String() + "/refunds", body: refundBody}},
	{name: "refund_bad_payment_id_404", req: request{method: "POST", path: "/v1/payments/nope/refunds", body: refundBody}},
	{name: "refund_invalid_body_400", req: request{method: "POST", path: refundsPath, body: `{"amount":"-1","reason":"a\u0000b","extra":1}`},
		setup: func(f *fixture) { f.paid() }},
	{name: "refund_too_many_digits_400", req: request{method: "POST", path: refundsPath, body: `{"amount":"1.001"}`},
		setup: func(f *fixture) { f.paid() }},
	// JSON is UTF-8 (RFC 8259): a reason in Latin-1 is refused, not kept with U+FFFD in place of é.
	{name: "refund_reason_not_utf8_400", req: request{method: "POST", path: refundsPath, body: "{\"amount\":\"3.00\",\"reason\":\"retourn\xe9\"}"},
		setup: func(f *fixture) { f.paid() },
		check: func(t *testing.T, f *fixture) { require.Zero(t, f.st.calls["BeginRefund"], "nothing is written") }},
	{name: "refund_unsupported_media_type_415", req: request{method: "POST", path: refundsPath, body: refundBody, header: map[string]string{"Content-Type": "text/plain"}}},
	{name: "refund_body_too_large_413", req: request{method: "POST", path: refundsPath, body: `{"reason":"` + strings.Repeat("x", payment.MaxBodyBytes) + `"}`}},
	{name: "refund_database_unavailable_503", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.st.fail["BeginRefund"] = fmt.Errorf("begin refund: %w", payment.ErrUnavailable) }},
	{name: "refund_workflow_start_failed_503", req: request{method: "POST", path: refundsPath, body: refundBody},
		setup: func(f *fixture) { f.paid(); f.wf.startErr = serviceerror.NewUnavailable("frontend down") },
		check: func(t *testing.T, f *fixture) {
			require.Equal(t, 1, f.st.calls["ExpireLease"], "the next retry may take over at once")
		}},
	// Reading refunds.
	{name: "get_refund_200", req: request{method: "GET", path: "/v1/refunds/" + fakeID(2).String()},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusSucceeded, time.Time{})
		}},
	{name: "get_refund_other_merchant_404", req: request{method: "GET", path: "/v1/refunds/" + fakeID(2).String(), header: map[string]string{"Authorization": "Bearer sk_b"}},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusSucceeded, time.Time{})
		}},
	{name: "get_refund_bad_id_404", req: request{method: "GET", path: "/v1/refunds/nope"}},
	{name: "list_refunds_200", req: request{method: "GET", path: refundsPath + "?limit=1"},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusSucceeded, time.Time{})
			f.seedRefund("r2", fakeID(1), `{"amount":"1"}`, payment.StatusFailed, time.Time{})
		}},
	{name: "list_refunds_next_page_200", req: request{method: "GET", path: refundsPath + "?limit=1&starting_after=" + fakeID(3).String()},
		setup: func(f *fixture) {
			f.paid()
			f.seedRefund("r1", fakeID(1), refundBody, payment.StatusSucceeded, time.Time{})
			f.seedRefund("r2", fakeID(1), `{"amount":"1"}`, payment.StatusFailed, time.Time{})
		}},
	{name: "list_refunds_empty_200", req: request{method: "GET", path: refundsPath},
		setup: func(f *fixture) { f.paid() }},
	{name: "list_refunds_other_merchant_404", req: request{method: "GET", path: refundsPath, header: map[string]string{"Authorization": "Bearer sk_b"}},
		setup: func(f *fixture) { f.paid() }},
	{name: "list_refunds_bad_params_400", req: request{method: "GET", path: refundsPath + "?limit=101&starting_after=x"},
		setup: func(f *fixture) { f.paid() }},
	{name: "list_refunds_unknown_cursor_400", req: request{method: "GET", path: refundsPath + "?starting_after=" + fakeID(99).String()},
		setup: func(f *fixture) { f.paid() }},

	// Reading payments and accounts.
	{name: "get_payment_200", req: request{method: "GET", path: "/v1/payments/" + fakeID(1).String()},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusSucceeded, time.Time{}) }},
	{name: "get_payment_other_merchant_404", req: request{method: "GET", path: "/v1/payments/" + fakeID(1).String(), header: map[string]string{"Authorization": "Bearer sk_b"}},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusSucceeded, time.Time{}) }},
	{name: "get_payment_bad_id_404", req: request{method: "GET", path: "/v1/payments/nope"}},
	{name: "get_payment_timeout_503", req: request{method: "GET", path: "/v1/payments/" + fakeID(1).String()},
		setup: func(f *fixture) { f.st.fail["Payment"] = context.DeadlineExceeded }},
	{name: "payment_by_key_200", req: request{method: "GET", path: "/v1/payments?idempotency_key=k1"},
		setup: func(f *fixture) { f.seed("k1", payBody, payment.StatusFailed, time.Time{}) }},
	{name: "list_payments_200", req: request{method: "GET", path: "/v1/payments?limit=1"},
		before: []request{{body: payBody}, {body: strings.Replace(payBody, "inv-1", "inv-2", 1), header: map[string]string{"Idempotency-Key": "k2"}}}},
	{name: "list_payments_bad_params_400", req: request{method: "GET", path: "/v1/payments?limit=0&status=paid&created_gte=2025-03-01"}},
	{name: "payment_by_key_unknown_404", req: request{method: "GET", path: "/v1/payments?idempotency_key=k9"}},
	{name: "get_account_200", req: request{method: "GET", path: "/v1/accounts/" + accountA.String()}},
	{name: "get_account_other_merchant_404", req: request{method: "GET", path: "/v1/accounts/" + accountB.String()}},
	{name: "route_not_found_404", req: request{method: "GET", path: "/v2/payments"}},
	{name: "method_not_allowed_405", req: request{method: "DELETE", path: "/v1/payments"}},

	// Admin routes.
	{name: "admin_unauthorized_401", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":"Acme"}`, header: map[string]string{"Authorization": "Bearer sk_a"}}},
	{name: "create_merchant_201", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":" Cafe ","webhook_url":"https://cafe.example/hooks"}`}},
	{name: "create_merchant_invalid_400", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":"","webhook_url":"ftp://x"}`}},
	{name: "create_merchant_unknown_field_400", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":"Cafe","plan":"gold"}`}},
	{name: "create_account_201", req: request{method: "POST", path: "/admin/v1/accounts", body: `{"merchant_id":"0192f1f0-0000-7000-8000-00000000000b","currency":"kwd"}`}},
	{name: "create_account_withdrawn_currency_400", req: request{method: "POST", path: "/admin/v1/accounts", body: `{"merchant_id":"0192f1f0-0000-7000-8000-00000000000b","currency":"DEM"}`}},
	{name: "create_account_no_merchant_400", req: request{method: "POST", path: "/admin/v1/accounts", body: `{"merchant_id":"0192f1f0-0000-7000-8000-0000000000ff","currency":"TRY"}`}},
	{name: "create_merchant_replayed_201", before: []request{{method: "POST", path: "/admin/v1/merchants", body: `{"name":"Cafe"}`, header: map[string]string{"Idempotency-Key": "m1"}}},
		req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":" Cafe "}`, header: map[string]string{"Idempotency-Key": "m1"}},
		check: func(t *testing.T, f *fixture) {
			require.Equal(t, 1, f.st.calls["CreateMerchant"], "one merchant")
		}},
	{name: "create_merchant_reused_key_422", before: []request{{method: "POST", path: "/admin/v1/merchants", body: `{"name":"Cafe"}`, header: map[string]string{"Idempotency-Key": "m1"}}},
		req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":"Bar"}`, header: map[string]string{"Idempotency-Key": "m1"}}},
	{name: "create_merchant_answer_expired_409", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":"Cafe"}`, header: map[string]string{"Idempotency-Key": "m1"}},
		setup: func(f *fixture) {
			f.st.fail["CreateMerchantOnce"] = &payment.AnswerExpiredError{MerchantID: merchantB.String()}
		}},
	{name: "create_merchant_bad_key_400", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":"Cafe"}`, header: map[string]string{"Idempotency-Key": "has space"}}},
	{name: "create_account_replayed_201", before: []request{{method: "POST", path: "/admin/v1/accounts", body: `{"merchant_id":"0192f1f0-0000-7000-8000-00000000000b","currency":"TRY"}`, header: map[string]string{"Idempotency-Key": "a1"}}},
		req: request{method: "POST", path: "/admin/v1/accounts", body: `{"currency":"try","merchant_id":"0192f1f0-0000-7000-8000-00000000000b"}`, header: map[string]string{"Idempotency-Key": "a1"}},
		check: func(t *testing.T, f *fixture) {
			require.Equal(t, 1, f.st.calls["CreateAccount"], "one account")
		}},
	{name: "create_account_reused_key_422", before: []request{{method: "POST", path: "/admin/v1/accounts", body: `{"merchant_id":"0192f1f0-0000-7000-8000-00000000000b","currency":"TRY"}`, header: map[string]string{"Idempotency-Key": "a1"}}},
		req: request{method: "POST", path: "/admin/v1/accounts", body: `{"merchant_id":"0192f1f0-0000-7000-8000-00000000000b","currency":"USD"}`, header: map[string]string{"Idempotency-Key": "a1"}}},
	{name: "deposit_201", req: request{method: "POST", path: "/admin/v1/accounts/" + accountA.String() + "/deposits", body: `{"amount":"5.50"}`, header: map[string]string{"Idempotency-Key": "d1"}}},
	{name: "deposit_replayed_201", before: []request{{method: "POST", path: "/admin/v1/accounts/" + accountA.String() + "/deposits", body: `{"amount":"5.50"}`, header: map[string]string{"Idempotency-Key": "d1"}}},
		req: request{method: "POST", path: "/admin/v1/accounts/" + accountA.String() + "/deposits", body: `{"amount":5.5}`, header: map[string]string{"Idempotency-Key": "d1"}}},
	{name: "deposit_reused_key_422", before: []request{{method: "POST", path: "/admin/v1/accounts/" + accountA.String() + "/deposits", body: `{"amount":"5.50"}`, header: map[string]string{"Idempotency-Key": "d1"}}},
		req: request{method: "POST", path: "/admin/v1/accounts/" + accountA.String() + "/deposits", body: `{"amount":"6"}`, header: map[string]string{"Idempotency-Key": "d1"}}},
	{name: "deposit_no_key_400", req: request{method: "POST", path: "/admin/v1/accounts/" + accountA.String() + "/deposits", body: `{"amount":"5.50"}`}},
	{name: "deposit_no_account_404", req: request{method: "POST", path: "/admin/v1/accounts/" + fakeID(99).String() + "/deposits", body: `{"amount":"5.50"}`, header: map[string]string{"Idempotency-Key": "d1"}}},
	{name: "deposit_bad_amount_400", req: request{method: "POST", path: "/admin/v1/accounts/" + accountA.String() + "/deposits", body: `{"amount":"-1"}`, header: map[string]string{"Idempotency-Key": "d1"}}},
	{name: "deliveries_200", req: request{method: "GET", path: "/admin/v1/merchants/" + merchantA.String() + "/deliveries"}},
	{name: "deliveries_bad_limit_400", req: request{method: "GET", path: "/admin/v1/merchants/" + merchantA.String() + "/deliveries?limit=0"}},
	{name: "deliveries_not_available_500", req: request{method: "GET", path: "/admin/v1/merchants/" + merchantA.String() + "/deliveries"},
		setup: func(f *fixture) { f.opts.Store = storeOnly{f.st} }},
	{name: "redeliver_202", req: request{method: "POST", path: "/admin/v1/deliveries/" + eventID.String() + "/redeliver"}},
	{name: "redeliver_unknown_404", req: request{method: "POST", path: "/admin/v1/deliveries/" + fakeID(99).String() + "/redeliver"}},
	{name: "settlements_200", req: request{method: "POST", path: "/admin/v1/settlements?date=2025-03-01", body: settlementCSV, header: map[string]string{"Content-Type": "text/csv"}}},
	{name: "settlements_invalid_file_400", req: request{method: "POST", path: "/admin/v1/settlements", header: map[string]string{"Content-Type": "text/csv"},
		body: settlementCSV + "2025-03-01,ch_3,nope,1,TRY,paid\n"}},
	{name: "settlements_not_csv_415", req: request{method: "POST", path: "/admin/v1/settlements", body: settlementCSV}},
	{name: "settlements_not_configured_500", req: request{method: "POST", path: "/admin/v1/settlements", body: settlementCSV, header: map[string]string{"Content-Type": "text/csv"}},
		setup: func(f *fixture) { f.opts.Reconciler = nil }},

	// API keys and webhook secrets of a merchant.
	{name: "create_api_key_201", req: request{method: "POST", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys"},
		check: func(t *testing.T, f *fixture) { require.Len(t, f.st.keys, 3) }},
	{name: "create_api_key_empty_object_201", req: request{method: "POST", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys", body: `{}`}},
	{name: "create_api_key_with_body_400", req: request{method: "POST", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys", body: `{"name":"ci"}`}},
	{name: "create_api_key_no_merchant_404", req: request{method: "POST", path: "/admin/v1/merchants/" + fakeID(99).String() + "/api-keys"}},
	{name: "create_api_key_bad_merchant_id_404", req: request{method: "POST", path: "/admin/v1/merchants/nope/api-keys"}},
	{name: "new_api_key_works_200",
		before: []request{{method: "POST", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys"}},
		req:    request{method: "GET", path: "/v1/accounts/" + accountA.String()},
		check: func(t *testing.T, f *fixture) {
			var fresh string
			for id, k := range f.st.keys {
				if id != keyA && id != keyB {
					fresh = k.apiKey
				}
			}
			rec := httptest.NewRecorder()
			New(f.opts).Handler().ServeHTTP(rec, request{method: "GET", path: "/v1/accounts/" + accountA.String(), header: map[string]string{"Authorization": "Bearer " + fresh}}.build())
			require.Equal(t, http.StatusOK, rec.Code, "the new key works next to the old one")
		}},
	{name: "list_api_keys_200", before: []request{{method: "DELETE", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys/" + keyA.String()}},
		req: request{method: "GET", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys"}},
	{name: "list_api_keys_no_merchant_404", req: request{method: "GET", path: "/admin/v1/merchants/" + fakeID(99).String() + "/api-keys"}},
	{name: "revoke_api_key_204", req: request{method: "DELETE", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys/" + keyA.String()},
		check: func(t *testing.T, f *fixture) { require.NotNil(t, f.st.keys[keyA].revoked) }},
	{name: "revoke_api_key_again_204", before: []request{{method: "DELETE", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys/" + keyA.String()}},
		req: request{method: "DELETE", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys/" + keyA.String()}},
	{name: "revoke_api_key_other_merchant_404", req: request{method: "DELETE", path: "/admin/v1/merchants/" + merchantB.String() + "/api-keys/" + keyA.String()}},
	{name: "revoke_api_key_unknown_404", req: request{method: "DELETE", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys/" + fakeID(99).String()}},
	{name: "revoke_api_key_bad_id_404", req: request{method: "DELETE", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys/nope"}},
	{name: "revoked_api_key_401",
		before: []request{
			{method: "GET", path: "/v1/accounts/" + accountA.String()}, // cached before the revocation
			{method: "DELETE", path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys/" + keyA.String()},
		},
		req: request{method: "GET", path: "/v1/accounts/" + accountA.String()}},
	{name: "rotate_webhook_secret_201", req: request{method: "POST", path: "/admin/v1/merchants/" + merchantA.String() + "/webhook-secret"}},
	{name: "rotate_webhook_secret_no_merchant_404", req: request{method: "POST", path: "/admin/v1/merchants/" + fakeID(99).String() + "/webhook-secret"}},

	// Admin bodies are as strict as payment bodies.
	{name: "create_merchant_duplicate_field_400", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":"Cafe","name":"Bar"}`}},
	{name: "create_merchant_other_case_400", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"Name":"Cafe"}`}},
	{name: "create_merchant_trailing_data_400", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":"Cafe"} {"name":"Bar"}`}},
	{name: "create_merchant_wrong_type_400", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":5}`}},
	{name: "create_merchant_name_not_utf8_400", req: request{method: "POST", path: "/admin/v1/merchants", body: "{\"name\":\"Caf\xe9\"}"},
		check: func(t *testing.T, f *fixture) {
			require.Zero(t, f.st.calls["CreateMerchant"], "no merchant is created")
		}},
	{name: "create_merchant_not_json_415", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":"Cafe"}`, header: map[string]string{"Content-Type": "text/plain"}}},
	{name: "create_merchant_too_large_413", req: request{method: "POST", path: "/admin/v1/merchants", body: `{"name":"` + strings.Repeat("x", payment.MaxBodyBytes) + `"}`}},
	{name: "create_account_other_case_400", req: request{method: "POST", path: "/admin/v1/accounts", body: `{"merchant_id":"0192f1f0-0000-7000-8000-00000000000b","CURRENCY":"TRY"}`}},
	{name: "deposit_duplicate_field_400", req: request{method: "POST", path: "/admin/v1/accounts/" + accountA.String() + "/deposits", body: `{"amount":"1","amount":"500"}`, header: map[string]string{"Idempotency-Key": "d1"}}},

	// Query parameters.
	{name: "payment_by_key_invalid_utf8_400", req: request{method: "GET", path: "/v1/payments?idempotency_key=%FF"}},
	{name: "payment_by_key_nul_400", req: request{method: "GET", path: "/v1/payments?idempotency_key=%00"}},
	{name: "payment_by_key_twice_400", req: request{method: "GET", path: "/v1/payments?idempotency_key=k1&idempotency_key=k2"}},
	{name: "payment_by_key_unknown_param_400", req: request{method: "GET", path: "/v1/payments?idempotency_key=k1&status=failed"}},
	{name: "payment_by_key_bad_escape_400", req: request{method: "GET", path: "/v1/payments?idempotency_key=%ZZ"}},
	{name: "get_payment_unknown_param_400", req: request{method: "GET", path: "/v1/payments/" + fakeID(1).String() + "?expand=all"}},
	{name: "create_payment_unknown_param_400", req: request{method: "POST", path: "/v1/payments?sync=false", body: payBody, header: map[string]string{"Idempotency-Key": "k1"}},
		check: func(t *testing.T, f *fixture) {
			require.Zero(t, f.st.calls["Begin"], "refused before anything is written")
		}},
	{name: "deliveries_limit_sign_400", req: request{method: "GET", path: "/admin/v1/merchants/" + merchantA.String() + "/deliveries?limit=+5"}},
	{name: "deliveries_limit_twice_400", req: request{method: "GET", path: "/admin/v1/merchants/" + merchantA.String() + "/deliveries?limit=5&limit=6"}},
	{name: "settlements_dry_run_not_boolean_400", req: request{method: "POST", path: "/admin/v1/settlements?dry_run=1", body: settlementCSV, header: map[string]string{"Content-Type": "text/csv"}},
		check: func(t *testing.T, f *fixture) { require.Zero(t, f.reconc.calls, "nothing imported") }},
	{name: "settlements_dry_run_empty_400", req: request{method: "POST", path: "/admin/v1/settlements?dry_run=", body: settlementCSV, header: map[string]string{"Content-Type": "text/csv"}}},
	{name: "settlements_unknown_param_400", req: request{method: "POST", path: "/admin/v1/settlements?dryrun=true", body: settlementCSV, header: map[string]string{"Content-Type": "text/csv"}}},

	// Limits.
	{name: "rate_limited_per_ip_429", before: []request{{method: "GET", path: "/healthz"}}, req: request{method: "GET", path: "/healthz"},
		setup: func(f *fixture) { f.opts.Limits.PerIP = Rate{PerSecond: 0.25, Burst: 1} }},
	{name: "rate_limited_per_merchant_429", before: []request{{body: payBody}}, req: request{body: payBody},
		setup: func(f *fixture) { f.opts.Limits.PerMerchant = Rate{PerSecond: 0.5, Burst: 1} },
		check: func(t *testing.T, f *fixture) {
			require.Equal(t, 1, f.wf.starts, "the limited request started nothing")
		}},

	// Health.
	{name: "healthz_200", req: request{method: "GET", path: "/healthz"}},
	{name: "readyz_200", req: request{method: "GET", path: "/readyz"}},
	{name: "readyz_503", req: request{method: "GET", path: "/readyz"},
		setup: func(f *fixture) {
			f.st.fail["Ping"] = errors.New("database: connection refused")
			f.wf.ready = errors.New("temporal: no poller on the payment task queue")
		}},
	{name: "readyz_search_attributes_missing_503", req: request{method: "GET", path: "/readyz"},
		setup: func(f *fixture) {
			f.opts.SearchAttributes = &fakeAttributes{missing: []string{"MerchantId", "PaymentStatus"}}
		}},
}

// TestHandlers compares each case's status, headers and body byte for byte with its golden
// answer; go test ./api -run TestHandlers -update rewrites them.
func TestHandlers(t *testing.T) {
	t.Parallel()
	for _, tc := range handlerCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := newFakeStore()
			f := &fixture{st: st, wf: &fakeWorkflows{st: st, outcome: payment.StatusSucceeded}, reconc: &parseOnly{}}
			f.opts = Options{
				Store: st, Workflows: f.wf, AdminToken: "adm", Reconciler: f.reconc,
				SyncWait: 50 * time.Millisecond, PollAfter: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
			}
			if tc.setup != nil {
				tc.setup(f)
			}
			h := New(f.opts).Handler()
			for _, r := range tc.before {
				h.ServeHTTP(httptest.NewRecorder(), r.build())
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, tc.req.build())
			got := render(rec, st.minted)
			if i := strings.LastIndex(tc.name, "_"); i > 0 {
				require.Equal(t, tc.name[i+1:], strconv.Itoa(rec.Code), "the status the case's name promises")
			}

			path := filepath.Join("testdata", tc.name+".golden")
			if *update {
				require.NoError(t, os.WriteFile(path, got, 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "no golden answer: run go test ./api -run TestHandlers -update")
			require.Equal(t, string(want), string(got))
			if tc.check != nil {
				tc.check(t, f)
			}
		})
	}
}

// render writes an answer as its golden file holds it: the status line, the compared headers
// and the body, with the random values the server minted replaced by placeholders.
func render(rec *httptest.ResponseRecorder, minted map[string]string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%d %s\n", rec.Code, http.StatusText(rec.Code))
	for _, h := range goldenHeaders {
		for _, v := range rec.Header().Values(h) {
			fmt.Fprintf(&b, "%s: %s\n", h, v)
		}
	}
	b.WriteString("\n")
	b.Write(rec.Body.Bytes())
	out := b.String()
	values := make([]string, 0, len(minted))
	for v := range minted {
		values = append(values, v)
	}
	sort.Strings(values)
	for _, v := range values {
		out = strings.ReplaceAll(out, v, minted[v])
	}
	return []byte(out)
}

// problemCode finds the codes writeError assigns (`p.Status, p.Code, ... = 400, "invalid_request", ...`).
var problemCode = regexp.MustCompile(`= \d{3}, "([a-z_]+)"`)

// TestHandlerCasesCoverEveryProblemCode keeps the table complete: every code writeError can
// answer has a golden answer.
func TestHandlerCasesCoverEveryProblemCode(t *testing.T) {
	src, err := os.ReadFile("errors.go")
	require.NoError(t, err)
	var codes []string
	for _, m := range problemCode.FindAllSubmatch(src, -1) {
		codes = append(codes, string(m[1]))
	}
	require.Len(t, codes, 23, "errors.go's problem codes are no longer found: adapt problemCode")
	seen := map[string]bool{}
	for _, tc := range handlerCases {
		b, err := os.ReadFile(filepath.Join("testdata", tc.name+".golden"))
		require.NoError(t, err)
		for _, c := range codes {
			if bytes.Contains(b, []byte(`"code":"`+c+`"`)) {
				seen[c] = true
			}
		}
	}
	for _, c := range codes {
		require.True(t, seen[c], "no handler case answers problem code %s", c)
	}
}
