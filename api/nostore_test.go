package api

import (
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The settlement import is an admin answer too: it carries Cache-Control: no-store, as
// docs/security.md says every admin answer does.
func TestSettlementAnswerIsNoStore(t *testing.T) {
	st := newFakeStore()
	h := New(Options{Store: st, Workflows: &fakeWorkflows{st: st}, AdminToken: "adm", Reconciler: &parseOnly{},
		Logger: slog.New(slog.DiscardHandler)}).Handler()
	req := httptest.NewRequest("POST", "/admin/v1/settlements?date=2025-03-01", strings.NewReader(settlementCSV))
	req.Header.Set("Authorization", "Bearer adm")
	req.Header.Set("Content-Type", "text/csv")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, 200, rec.Code, rec.Body.String())
	require.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
}
