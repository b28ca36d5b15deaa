package api

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// newTestServer is a server over fresh fakes that accepts merchant A's key and the admin token.
func newTestServer(t *testing.T, setup func(o *Options)) (*Server, *fakeStore, *fakeWorkflows) {
	t.Helper()
	st := newFakeStore()
	wf := &fakeWorkflows{st: st, outcome: payment.StatusSucceeded}
	o := Options{
		Store: st, Workflows: wf, AdminToken: "adm", Reconciler: &parseOnly{},
		SyncWait: 50 * time.Millisecond, PollAfter: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	}
	if setup != nil {
		setup(&o)
	}
	return New(o), st, wf
}

// latencySeries counts the request-latency histogram's series in a /metrics answer.
func latencySeries(t *testing.T, h http.Handler) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	n := 0
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, "kasa_http_request_duration_seconds_count{") {
			n++
		}
	}
	return n
}

// TestMetricsLabelsAreBounded: requests with made-up methods and paths, as anyone can send
// without a key, must not add series to /metrics (each series is memory kept for ever).
func TestMetricsLabelsAreBounded(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestServer(t, nil)
	h := s.Handler()
	send := func(method, path string) {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, path, nil))
	}
	// Every known method on a matched and an unmatched path, so that the bound below is reached.
	for _, m := range []string{"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"} {
		send(m, "/healthz")
		send(m, "/nowhere")
	}
	before := latencySeries(t, h)

	r := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		method := fmt.Sprintf("M%08X", r.Uint32())
		path := fmt.Sprintf("/x/%d/%08x", i, r.Uint32())
		send(method, path)
		send(method, "/healthz")
		send(method, "/v1/payments/"+path[3:])
	}
	after := latencySeries(t, h)
	require.LessOrEqual(t, after, before+4, "random methods and paths must map to a fixed set of label values")

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	require.Contains(t, body, `method="other"`)
	require.Contains(t, body, `route="unmatched"`)
	require.NotContains(t, body, `method="M`)
}

// TestMetricsOnItsOwnAddress: with SeparateMetrics, the merchant port does not serve /metrics
// (404 like any unknown route) and MetricsHandler does; without it, the API port serves it.
func TestMetricsOnItsOwnAddress(t *testing.T) {
	t.Parallel()
	get := func(h http.Handler, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec
	}
	for _, tc := range []struct {
		name     string
		separate bool
		apiCode  int
	}{
		{"on the API port", false, http.StatusOK},
		{"on its own address", true, http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _, _ := newTestServer(t, func(o *Options) { o.SeparateMetrics = tc.separate })
			get(s.Handler(), "/healthz")
			rec := get(s.Handler(), "/metrics")
			require.Equal(t, tc.apiCode, rec.Code)
			if tc.separate {
				require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
				rec = get(s.MetricsHandler(), "/metrics")
				require.Equal(t, http.StatusOK, rec.Code)
				require.Equal(t, http.StatusNotFound, get(s.MetricsHandler(), "/v1/payments").Code, "only /metrics there")
			}
			require.Contains(t, rec.Body.String(), `kasa_http_request_duration_seconds_count{method="GET",route="/healthz",status="200"} 1`)
		})
	}
}

// Refund routes are labelled by their templates: every refund id and payment id shares a series.
func TestMetricsRefundRoutesByTemplate(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestServer(t, nil)
	h := s.Handler()
	send := func(method, path string) {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(method, path, nil))
	}
	for range 50 {
		send(http.MethodGet, "/v1/refunds/"+payment.NewID().String())
		send(http.MethodPost, "/v1/payments/"+payment.NewID().String()+"/refunds")
		send(http.MethodGet, "/v1/payments/"+payment.NewID().String()+"/refunds")
	}
	require.Equal(t, 3, latencySeries(t, h))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	require.Contains(t, body, `method="GET",route="/v1/refunds/:id",status="401"} 50`)
	require.Contains(t, body, `method="POST",route="/v1/payments/:id/refunds",status="401"} 50`)
	require.Contains(t, body, `method="GET",route="/v1/payments/:id/refunds",status="401"} 50`)
}
