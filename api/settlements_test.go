package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/reconcile"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/workflows"
)

// parseOnly parses like the real reconciler and reports every line as matched.
type parseOnly struct {
	got   reconcile.Options
	calls int
	err   error
}

func (p *parseOnly) Import(_ context.Context, f io.Reader, o reconcile.Options) (*reconcile.Report, error) {
	p.calls++
	p.got = o
	if p.err != nil {
		return nil, p.err
	}
	lines, err := reconcile.Parse(f)
	if err != nil {
		return nil, err
	}
	r := &reconcile.Report{DryRun: o.DryRun, Days: o.Days, Lines: len(lines)}
	r.Counts.Matched = len(lines)
	return r, nil
}

const settlementCSV = "settlement_date,provider_charge_id,reference,amount,currency,status\n" +
	"2025-03-01,ch_1,0192f1f0-7d0c-7a39-9c5e-8f6a8b0a1c01,10.00,TRY,settled\n"

func postSettlement(t *testing.T, h http.Handler, query, contentType, body string) (*httptest.ResponseRecorder, map[string]any) {
	t.Helper()
	req := httptest.NewRequest("POST", "/admin/v1/settlements"+query, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer adm")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var m map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &m), "%s", rec.Body)
	return rec, m
}

func TestSettlementsEndpoint(t *testing.T) {
	t.Parallel()
	rc := &parseOnly{}
	h := New(Options{Store: newFakeStore(), AdminToken: "adm", Reconciler: rc, Logger: slog.New(slog.DiscardHandler)}).Handler()

	rec, body := postSettlement(t, h, "?date=2025-03-01&merchant_id=0192f1f0-0000-7000-8000-00000000000a", "text/csv; charset=utf-8", settlementCSV)
	require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.Equal(t, true, body["ok"])
	require.Equal(t, float64(1), body["lines"])
	require.Equal(t, []reconcile.Day{"2025-03-01"}, rc.got.Days)
	require.Equal(t, "0192f1f0-0000-7000-8000-00000000000a", rc.got.Merchants[0].String())
	require.False(t, rc.got.DryRun)
	require.Equal(t, false, body["dry_run"])

	rec, body = postSettlement(t, h, "?dry_run=true", "text/csv", settlementCSV)
	require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
	require.True(t, rc.got.DryRun)
	require.Equal(t, true, body["dry_run"], "the report says it was a dry run")

	rec, _ = postSettlement(t, h, "?scope=all", "text/csv", settlementCSV)
	require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
	require.True(t, rc.got.AllMerchants)
	require.Empty(t, rc.got.Merchants)
	rec, _ = postSettlement(t, h, "", "text/csv", settlementCSV)
	require.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
	require.False(t, rc.got.AllMerchants, "no scope declared")
	require.Empty(t, rc.got.Merchants)
	for _, q := range []string{"?scope=merchants", "?scope=", "?scope=all&merchant_id=0192f1f0-0000-7000-8000-00000000000a"} {
		rec, body = postSettlement(t, h, q, "text/csv", settlementCSV)
		require.Equal(t, http.StatusBadRequest, rec.Code, q)
		require.Equal(t, "scope", body["errors"].([]any)[0].(map[string]any)["field"], q)
	}

	bad := settlementCSV + "2025-03-01,ch_2,0192f1f0-7d0c-7a39-9c5e-8f6a8b0a1c02,10.001,TRY,settled\n2025-03-01,ch_3,nope,1,TRY,paid\n"
	rec, body = postSettlement(t, h, "", "text/csv", bad)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
	require.Equal(t, "invalid_settlement_file", body["code"])
	errs := body["errors"].([]any)
	require.Len(t, errs, 3)
	require.Equal(t, map[string]any{"field": "line 3", "message": `amount: "10.001": ` + payment.ErrTooManyDecimals.Error()}, errs[0])
	require.Equal(t, "line 4", errs[1].(map[string]any)["field"])
	require.Contains(t, body["detail"], "line 3: amount:")

	calls := rc.calls
	rec, body = postSettlement(t, h, "", "application/json", settlementCSV)
	require.Equal(t, http.StatusUnsupportedMediaType, rec.Code)
	require.Equal(t, "unsupported_media_type", body["code"])
	require.Equal(t, "content type must be text/csv", body["detail"])
	rec, _ = postSettlement(t, h, "", "", settlementCSV)
	require.Equal(t, http.StatusUnsupportedMediaType, rec.Code)

	rec, body = postSettlement(t, h, "?date=yesterday&merchant_id=acme&dry_run=maybe", "text/csv", settlementCSV)
	require.Equal(t, http.StatusBadRequest, rec.Code)
	require.Equal(t, "invalid_request", body["code"])
	require.Len(t, body["errors"], 3)
	require.Equal(t, map[string]any{"field": "dry_run", "message": "must be true or false"}, body["errors"].([]any)[2])

	big := settlementCSV + strings.Repeat("x", MaxSettlementBytes)
	rec, body = postSettlement(t, h, "", "text/csv", big)
	require.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
	require.Equal(t, "request body exceeds 16 MiB", body["detail"])
	require.Equal(t, calls, rc.calls, "rejected requests never reach the reconciler")

	rc.err = payment.ErrUnavailable
	rec, body = postSettlement(t, h, "", "text/csv", settlementCSV)
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "unavailable", body["code"])
}

func TestSettlementsNeedsAdmin(t *testing.T) {
	t.Parallel()
	h := New(Options{Store: newFakeStore(), AdminToken: "adm", Reconciler: &parseOnly{}}).Handler()
	req := httptest.NewRequest("POST", "/admin/v1/settlements", strings.NewReader(settlementCSV))
	req.Header.Set("Content-Type", "text/csv")
	req.Header.Set("Authorization", "Bearer sk_merchant")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusUnauthorized, rec.Code)
}

// oneUnknown is a reconcile.Store holding one unknown payment, and a Settler whose workflow
// never answers (no worker polls the task queue): the documented settle_failed case.
type oneUnknown struct{ p payment.Payment }

func (o *oneUnknown) PaymentsByID(context.Context, []uuid.UUID) ([]payment.Payment, error) {
	return []payment.Payment{o.p}, nil
}
func (o *oneUnknown) Payment(context.Context, uuid.UUID) (payment.Payment, error) { return o.p, nil }
func (o *oneUnknown) Now(context.Context) (time.Time, error)                      { return time.Now(), nil }
func (o *oneUnknown) EachPaymentCreated(context.Context, time.Time, time.Time, []payment.Status, []uuid.UUID, func(payment.Payment, time.Time) error) error {
	return nil
}
func (o *oneUnknown) RefundsByID(context.Context, []uuid.UUID) ([]payment.Refund, error) {
	return nil, nil
}
func (o *oneUnknown) Refund(context.Context, uuid.UUID) (payment.Refund, error) {
	return payment.Refund{}, payment.ErrNotFound
}
func (o *oneUnknown) EachRefundCreated(context.Context, time.Time, time.Time, []payment.Status, []uuid.UUID, func(payment.Refund, time.Time) error) error {
	return nil
}
func (o *oneUnknown) CaptureInFlight(context.Context, uuid.UUID) (bool, error) { return false, nil }
func (o *oneUnknown) SettlementListings(context.Context, string, []uuid.UUID, []time.Time, bool) (map[uuid.UUID][]time.Time, error) {
	return nil, nil
}
func (o *oneUnknown) RecordSettlementCompletions(context.Context, string, []uuid.UUID, []time.Time, []time.Time) error {
	return nil
}
func (o *oneUnknown) SettlementCompletions(context.Context, string, []time.Time, []uuid.UUID) (map[time.Time]map[uuid.UUID]time.Time, error) {
	return nil, nil
}
func (o *oneUnknown) EachCaptureDecided(context.Context, time.Time, time.Time, []payment.Status, []uuid.UUID, func(payment.Payment, time.Time, time.Time) error) error {
	return nil
}
func (o *oneUnknown) Settle(ctx context.Context, _ string, _ workflows.Settlement) (string, error) {
	<-ctx.Done() // the workflow does not answer in time
	return "", ctx.Err()
}

// A settlement import may take longer than the server's write timeout (each settle waits up to
// its SettleTimeout for a workflow that does not answer): its report still reaches the operator,
// here with the settle_failed mismatch the docs tell them to act on.
func TestSettlementImportLongerThanTheWriteTimeoutIsAnswered(t *testing.T) {
	id := payment.NewID()
	day := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	st := &oneUnknown{p: payment.Payment{ID: id, MerchantID: payment.NewID(), IdempotencyKey: "k", AmountMinor: 1000, Currency: "TRY",
		Status: payment.StatusUnknown, CreatedAt: day, UpdatedAt: day}}
	s, _, _ := newTestServer(t, func(o *Options) {
		o.Reconciler = &reconcile.Reconciler{Store: st, Settler: st, SettleTimeout: 1500 * time.Millisecond}
		o.Limits = Limits{ReadTimeout: 5 * time.Second, WriteTimeout: time.Second, IdleTimeout: 5 * time.Second}
	})
	addr := serveTCP(t, s)
	csv := "settlement_date,provider_charge_id,reference,amount,currency,status\n2025-03-01,ch_1," + id.String() + ",10.00,TRY,settled\n"
	req, err := http.NewRequest("POST", "http://"+addr+"/admin/v1/settlements?scope=all", strings.NewReader(csv))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer adm")
	req.Header.Set("Content-Type", "text/csv")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "the import ran to its end: its report must reach the operator")
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), "settle_failed")
}

// parkedSettles holds unknown payments whose workflows take no settlement (no worker runs), until
// its client is closed, as `kasa api` closes Temporal's client once its HTTP server has shut down.
type parkedSettles struct {
	oneUnknown
	payments []payment.Payment
	closed   chan struct{}
	settles  atomic.Int32
	runs     atomic.Int32
}

func (p *parkedSettles) PaymentsByID(context.Context, []uuid.UUID) ([]payment.Payment, error) {
	return p.payments, nil
}

func (p *parkedSettles) Settle(ctx context.Context, _ string, _ workflows.Settlement) (string, error) {
	p.settles.Add(1)
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case <-p.closed:
		return "", errors.New("Timeout or cancellation waiting for update: grpc: the client connection is closing")
	}
}

func (p *parkedSettles) RecordReconciliation(context.Context, store.ReconciliationRun) error {
	p.runs.Add(1)
	return nil
}

// An import running when its server starts shutting down stops there, as kasa reconcile does on
// SIGTERM: it sends no further settlement, lets the server shut down at once (before the
// Temporal client and the database its settlements use are closed), records no run and answers
// 503 unavailable with Retry-After (import again), never a report of settlements cut short.
func TestSettlementImportStopsWhenTheServerShutsDown(t *testing.T) {
	t.Parallel()
	day := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	csv := "settlement_date,provider_charge_id,reference,amount,currency,status\n"
	st := &parkedSettles{closed: make(chan struct{})}
	for i := range 8 {
		p := payment.Payment{ID: payment.NewID(), MerchantID: payment.NewID(), IdempotencyKey: fmt.Sprint("k", i), AmountMinor: 1000,
			Currency: "TRY", Status: payment.StatusUnknown, CreatedAt: day, UpdatedAt: day}
		st.payments = append(st.payments, p)
		csv += fmt.Sprintf("2025-03-01,ch_%d,%s,10.00,TRY,settled\n", i, p.ID)
	}
	s, _, _ := newTestServer(t, func(o *Options) {
		o.Reconciler = &reconcile.Reconciler{Store: st, Settler: st, Runs: st, Concurrency: 1}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := s.HTTPServer()
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(s.Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Close(); <-served })

	type answer struct {
		status int
		header http.Header
		body   []byte
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		req, err := http.NewRequest("POST", "http://"+ln.Addr().String()+"/admin/v1/settlements?scope=all", strings.NewReader(csv))
		if err != nil {
			answered <- answer{err: err}
			return
		}
		req.Header.Set("Authorization", "Bearer adm")
		req.Header.Set("Content-Type", "text/csv")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		answered <- answer{resp.StatusCode, resp.Header, body, err}
	}()
	require.Eventually(t, func() bool { return st.settles.Load() == 1 }, 5*time.Second, 10*time.Millisecond, "the first settlement waits")

	// kasa api: the server's Shutdown (10 s there), then Temporal's client closed.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	began := time.Now()
	err = srv.Shutdown(ctx)
	close(st.closed)
	require.NoError(t, err, "the import let its server shut down")
	require.Less(t, time.Since(began), 2*time.Second)

	a := <-answered
	require.NoError(t, a.err)
	require.Equal(t, http.StatusServiceUnavailable, a.status, "%s", a.body)
	require.Contains(t, string(a.body), `"code":"unavailable"`)
	require.Equal(t, "1", a.header.Get("Retry-After"))
	require.NotContains(t, string(a.body), "settle_failed")
	require.Equal(t, int32(1), st.settles.Load(), "no settlement is sent once shutdown began")
	require.Zero(t, st.runs.Load(), "no run recorded")
}
