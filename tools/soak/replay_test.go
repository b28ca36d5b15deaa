package soak

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

// A final replay that the API asks to wait (429 or 503 with Retry-After) is sent again after
// the wait, as a real client does: only the answer after it is checked against the history.
func TestReplayHonoursRetryAfter(t *testing.T) {
	const id = "01a2b3c4-0000-7000-8000-000000000001"
	var sent atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch sent.Add(1) {
		case 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		case 2:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(payment.Resource{ID: id, Status: payment.StatusSucceeded})
		}
	}))
	t.Cleanup(srv.Close)
	a := &api{base: srv.URL, http: srv.Client()}
	k := &keyRecord{Key: "k-1", Merchant: &merchant{APIKey: "sk"}, ID: id, ids: map[string]bool{id: true}}
	st := &settled{payments: map[string]*paid{id: {id: id, res: resource{Resource: payment.Resource{ID: id, Status: payment.StatusSucceeded}}, key: k}}}

	require.Empty(t, replayProblems(a, k, st))
	require.EqualValues(t, 3, sent.Load(), "sent again after each wait")
}

// An answer that is not a request to wait is checked at once: a 429 without Retry-After is not
// the contract's answer, and a wrong status stays a violation.
func TestReplayReportsAWrongAnswer(t *testing.T) {
	const id = "01a2b3c4-0000-7000-8000-000000000002"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(srv.Close)
	a := &api{base: srv.URL, http: srv.Client()}
	k := &keyRecord{Key: "k-2", Merchant: &merchant{APIKey: "sk"}, ID: id, ids: map[string]bool{id: true}}
	st := &settled{payments: map[string]*paid{id: {id: id, res: resource{Resource: payment.Resource{ID: id, Status: payment.StatusSucceeded}}, key: k}}}
	problems := replayProblems(a, k, st)
	require.Len(t, problems, 1)
	require.Contains(t, problems[0], "replay answered 429, want 201")
}
