package api

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// HEAD is allowed wherever GET is (RFC 9110 §9.3.2): the same status and headers as the GET,
// with its Content-Length, and no body, whatever the answer (200, 401, 404, 400). A path that
// takes no GET still answers 405, naming HEAD where GET is allowed.
func TestHeadAnswersAsGetWithoutBody(t *testing.T) {
	t.Parallel()
	st := newFakeStore()
	f := &fixture{st: st, wf: &fakeWorkflows{st: st, outcome: payment.StatusSucceeded}}
	f.seed("k1", payBody, payment.StatusSucceeded, time.Time{})
	h := New(Options{Store: st, Workflows: f.wf, AdminToken: "adm", SyncWait: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}).Handler()
	serve := func(method, path string, header map[string]string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request{method: method, path: path, header: header}.build())
		return rec
	}
	for _, c := range []struct {
		name, path string
		header     map[string]string
		status     int
	}{
		{"health", "/healthz", nil, 200},
		{"openapi", "/openapi.yaml", nil, 200},
		{"payment", "/v1/payments/" + fakeID(1).String(), nil, 200},
		{"payment by key", "/v1/payments?idempotency_key=k1", nil, 200},
		{"payment list", "/v1/payments?limit=5", nil, 200},
		{"bad list parameter", "/v1/payments?limit=0", nil, 400},
		{"another merchant's payment", "/v1/payments/" + fakeID(1).String(), map[string]string{"Authorization": "Bearer sk_b"}, 404},
		{"no credential", "/v1/payments/" + fakeID(1).String(), map[string]string{"Authorization": ""}, 401},
		{"refunds of a payment", "/v1/payments/" + fakeID(1).String() + "/refunds", nil, 200},
		{"refund", "/v1/refunds/" + fakeID(9).String(), nil, 404},
		{"account", "/v1/accounts/" + accountA.String(), nil, 200},
		{"admin api keys", "/admin/v1/merchants/" + merchantA.String() + "/api-keys", nil, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			get := serve(http.MethodGet, c.path, c.header)
			head := serve(http.MethodHead, c.path, c.header)
			require.Equal(t, c.status, get.Code, "%s", get.Body)
			require.Equal(t, get.Code, head.Code, "%s", head.Body)
			require.Empty(t, head.Body.Bytes(), "a HEAD answer has no body")
			want := get.Header().Clone()
			want.Set("Content-Length", strconv.Itoa(get.Body.Len()))
			require.Equal(t, want, head.Header())
		})
	}

	post := serve(http.MethodHead, "/admin/v1/merchants", nil)
	require.Equal(t, http.StatusMethodNotAllowed, post.Code)
	require.Empty(t, post.Body.Bytes())
	require.Equal(t, "GET, HEAD", serve(http.MethodDelete, "/v1/payments/"+fakeID(1).String(), nil).Header().Get("Allow"))
}
