package api

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// The request id a client sends is kept only when it is printable ASCII: any other would leave
// the admin call out of admin_audit (PostgreSQL refuses bytes that are not UTF-8).
func TestRequestIDKeptOnlyWhenPrintable(t *testing.T) {
	for _, tt := range []struct {
		sent string
		kept bool
	}{{"op-42", true}, {"op-\xff\xfe", false}, {"op 42", false}, {"op-é", false}, {strings.Repeat("a", 129), false}} {
		st := newFakeStore()
		h := New(Options{Store: st, Workflows: &fakeWorkflows{st: st}, AdminToken: "adm", Logger: slog.New(slog.DiscardHandler)}).Handler()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request{method: http.MethodPost, path: "/admin/v1/merchants", body: `{"name":"Audited"}`,
			header: map[string]string{"X-Request-Id": tt.sent}}.build())
		require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
		require.Len(t, st.audit, 1)
		got := st.audit[0].RequestID
		require.Equal(t, rec.Header().Get("X-Request-Id"), got)
		require.True(t, payment.ValidKey(got), "%q audited as %q", tt.sent, got)
		require.Equal(t, tt.kept, got == tt.sent, "%q audited as %q", tt.sent, got)
	}
}

// An admin call whose handler panics is answered 500 and audited all the same (it may have
// changed something first), and the panic is logged once, with its stack.
func TestPanickingAdminCallIsAuditedAndLoggedOnce(t *testing.T) {
	st := newFakeStore()
	st.fail["CreateAccount"] = errPanicNow
	var logs bytes.Buffer
	h := New(Options{Store: st, Workflows: &fakeWorkflows{st: st}, AdminToken: "adm", Logger: slog.New(slog.NewTextHandler(&logs, nil))}).Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request{method: http.MethodPost, path: "/admin/v1/accounts", body: `{"merchant_id":"` + merchantA.String() + `","currency":"TRY"}`}.build())
	require.Equal(t, http.StatusInternalServerError, rec.Code, rec.Body.String())
	require.Len(t, st.audit, 1, "the 500 admin call is in the audit")
	require.Equal(t, http.StatusInternalServerError, st.audit[0].Status)
	require.Equal(t, 1, strings.Count(logs.String(), "request_id=req-1"), "the 500 is logged once:\n%s", logs.String())
	require.Contains(t, logs.String(), "goroutine", "with its stack")
}

// A path with a trailing slash is no route of kasa's: answered 404 problem+json with a request
// id, not redirected by the router.
func TestTrailingSlashIsNotFound(t *testing.T) {
	st := newFakeStore()
	h := New(Options{Store: st, Workflows: &fakeWorkflows{st: st}, AdminToken: "adm", Logger: slog.New(slog.DiscardHandler)}).Handler()
	for _, path := range []string{"/v1/payments/", "/healthz/"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request{method: http.MethodGet, path: path}.build())
		require.Equal(t, http.StatusNotFound, rec.Code, path)
		require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"), path)
		require.Contains(t, rec.Body.String(), `"request_id":"req-1"`, path)
	}
}

// The audit's times are rendered as every time of the API: UTC, RFC 3339 with microseconds,
// whatever zone the database driver read them in and however many of their digits are zeros.
func TestAuditTimesAreUTCWithMicroseconds(t *testing.T) {
	st := newFakeStore()
	at := time.Date(2025, 3, 1, 15, 0, 0, 120000000, time.FixedZone("TRT", 3*60*60))
	st.audit = append(st.audit, store.AuditEntry{ID: fakeID(1), At: at, TokenID: "adm_x", Method: "POST", Route: "/admin/v1/merchants",
		Target: "/admin/v1/merchants", Status: http.StatusCreated, RequestID: "req-0"})
	h := New(Options{Store: st, Workflows: &fakeWorkflows{st: st}, AdminToken: "adm", Logger: slog.New(slog.DiscardHandler)}).Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request{method: http.MethodGet, path: "/admin/v1/audit"}.build())
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var page struct {
		Data []map[string]any `json:"data"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &page))
	require.Len(t, page.Data, 1)
	require.Equal(t, "2025-03-01T12:00:00.120000Z", page.Data[0]["at"])
}
