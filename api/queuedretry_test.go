package api

import (
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// With no backlog here (Backlog.State nil), a retry of a payment another process queued still
// gets its 409, with the usual Retry-After.
func TestQueuedRetryWithoutBacklogState(t *testing.T) {
	st := newFakeStore()
	f := &fixture{st: st, wf: &fakeWorkflows{st: st, outcome: payment.StatusSucceeded}, reconc: &parseOnly{}}
	f.opts = Options{Store: st, Workflows: f.wf, AdminToken: "adm", Reconciler: f.reconc,
		SyncWait: 50 * time.Millisecond, PollAfter: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	f.seedQueued("k1", payBody)
	h := New(f.opts).Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request{body: payBody}.build())
	require.Equal(t, 409, rec.Code, rec.Body.String())
	require.Equal(t, "1", rec.Header().Get("Retry-After"))
}
