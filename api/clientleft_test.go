package api

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// leavingStore is the fake store whose Begin sees its client leave as it commits: what it began
// is written, and a canceled context answers as PostgreSQL's driver then does.
type leavingStore struct {
	*fakeStore
	leave func()
}

func (s leavingStore) Begin(ctx context.Context, in store.BeginInput) (store.Record, payment.Payment, store.Began, error) {
	s.leave()
	rec, p, began, err := s.fakeStore.Begin(ctx, in)
	if err == nil {
		err = ctx.Err()
	}
	return rec, p, began, err
}

func (s leavingStore) BeginRefund(ctx context.Context, in store.BeginRefundInput) (store.Record, payment.Refund, store.Began, error) {
	s.leave()
	rec, r, began, err := s.fakeStore.BeginRefund(ctx, in)
	if err == nil {
		err = ctx.Err()
	}
	return rec, r, began, err
}

// leavingWorkflows starts workflows whose client leaves while the start is on its way: the start
// is made, and a canceled context loses its answer.
type leavingWorkflows struct {
	*fakeWorkflows
	leave func()
}

func (w leavingWorkflows) StartPayment(ctx context.Context, key string, in workflows.PaymentInput) (string, error) {
	w.leave()
	run, err := w.fakeWorkflows.StartPayment(ctx, key, in)
	if err == nil {
		err = ctx.Err()
	}
	return run, err
}

func (w leavingWorkflows) StartRefund(ctx context.Context, key string, in workflows.RefundInput) (string, error) {
	w.leave()
	run, err := w.fakeWorkflows.StartRefund(ctx, key, in)
	if err == nil {
		err = ctx.Err()
	}
	return run, err
}

// TestClientLeavingMidCreateLeavesNothingHalfDone: a client that times out while its new payment
// or refund is committed, or its workflow started, does not cut that work in two. Cut, the commit
// left a record leased to a request that had gone, with no workflow, and every retry answered
// 409 until the lease ran out (30 s); a start cut on its way left a run whose first task waited
// out Temporal's task timeout.
func TestClientLeavingMidCreateLeavesNothingHalfDone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		refund bool
		at     string // "begin" or "start"
	}{
		{"payment, client leaves at the commit", false, "begin"},
		{"payment, client leaves at the start", false, "start"},
		{"refund, client leaves at the commit", true, "begin"},
		{"refund, client leaves at the start", true, "start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, leave := context.WithCancel(context.Background())
			defer leave()
			st := newFakeStore()
			f := &fixture{st: st, wf: &fakeWorkflows{st: st, outcome: payment.StatusSucceeded}}
			req := request{body: payBody}
			if tc.refund {
				f.paid()
				req = request{method: "POST", path: refundsPath, body: refundBody}
			}
			var s Store = st
			var wf Workflows = f.wf
			if tc.at == "begin" {
				s = leavingStore{st, leave}
			} else {
				wf = leavingWorkflows{f.wf, leave}
			}
			srv, _, _ := newTestServer(t, func(o *Options) { o.Store, o.Workflows = s, wf })
			h := srv.Handler()
			h.ServeHTTP(httptest.NewRecorder(), req.build().WithContext(ctx))

			require.Equal(t, 1, f.wf.starts, "the workflow was started once")
			require.Zero(t, st.calls["ExpireLease"], "no lease given back for a start that was made")
			st.mu.Lock()
			records := st.records
			if tc.refund {
				records = st.refundRecords
			}
			var done int
			for _, rec := range records {
				if rec.Status == store.RecordCompleted && rec.Outcome == payment.StatusSucceeded {
					done++
				}
			}
			st.mu.Unlock()
			require.Equal(t, 1, done, "the operation went on to its outcome")

			again := httptest.NewRecorder()
			h.ServeHTTP(again, req.build())
			require.Equal(t, 201, again.Code, "the retry gets the outcome at once: %s", again.Body)
			require.Equal(t, "true", again.Header().Get("Idempotent-Replayed"))
			require.Equal(t, 1, f.wf.starts, "the retry started nothing")
		})
	}
}

// TestClientLeftIsNoServerError: a read that fails because the client left (as PostgreSQL's
// driver fails on a canceled context) is not logged as the server's error: the request is
// recorded as 499, and the log says the client left.
func TestClientLeftIsNoServerError(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	srv, st, wf := newTestServer(t, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	wf.outcome = "" // still processing at the sync wait's end: the record is read
	ctx, leave := context.WithCancel(context.Background())
	st.before["Record"] = func() {
		leave()
		st.mu.Lock()
		st.fail["Record"] = context.Canceled
		st.mu.Unlock()
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, request{body: payBody}.build().WithContext(ctx))
	require.Equal(t, statusClientClosedRequest, rec.Code)
	require.NotContains(t, logs.String(), "level=ERROR")
	require.Contains(t, logs.String(), "the client left")
}

// stalledBegin is a database that takes the key lookups but stalls in a new operation's commit
// until its context ends, then fails as pgx does.
type stalledBegin struct{ *fakeStore }

func (s stalledBegin) Begin(ctx context.Context, _ store.BeginInput) (store.Record, payment.Payment, store.Began, error) {
	<-ctx.Done()
	return store.Record{}, payment.Payment{}, 0, ctx.Err()
}

// stalledStart is a Temporal that does not answer a workflow's start until its context ends.
type stalledStart struct{ *fakeWorkflows }

func (w stalledStart) StartPayment(ctx context.Context, _ string, _ workflows.PaymentInput) (string, error) {
	<-ctx.Done()
	return "", ctx.Err()
}

// TestStalledCommitOrStartAnswersBeforeTheWriteTimeout: the work a client that leaves does not
// cut (a new operation's commit, its workflow's start) still ends at the request's deadline, a
// second before the write timeout: a database or Temporal that stalls there is answered 503
// with Retry-After, never with a connection closed without an answer once the write timeout passed.
func TestStalledCommitOrStartAnswersBeforeTheWriteTimeout(t *testing.T) {
	t.Parallel()
	for _, at := range []string{"commit", "start"} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			const writeTimeout = 1500 * time.Millisecond
			s, st, _ := newTestServer(t, func(o *Options) {
				if at == "commit" {
					o.Store = stalledBegin{o.Store.(*fakeStore)}
				} else {
					o.Workflows = stalledStart{o.Workflows.(*fakeWorkflows)}
				}
				o.Lease = 5 * time.Second // longer than the write timeout, as by default (30 s each)
				o.Limits = Limits{ReadTimeout: time.Second, WriteTimeout: writeTimeout, IdleTimeout: time.Second}
			})
			addr := serveTCP(t, s)
			req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/payments", strings.NewReader(payBody))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer sk_a")
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "k-stalled-"+at)
			began := time.Now()
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err, "an answer, not a connection closed after %s", time.Since(began))
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Less(t, time.Since(began), writeTimeout)
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
			require.Contains(t, string(b), `"code":"unavailable"`)
			require.NotEmpty(t, resp.Header.Get("Retry-After"))
			if at == "start" {
				st.mu.Lock()
				expired := st.calls["ExpireLease"]
				st.mu.Unlock()
				require.Equal(t, 1, expired, "the record's lease is given back for the retry")
			}
		})
	}
}
