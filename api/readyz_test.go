package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/workflows"
)

// countingWorkflows counts readiness checks of the Temporal side.
type countingWorkflows struct {
	Workflows
	ready atomic.Int32
}

func (w *countingWorkflows) Ready(ctx context.Context) error {
	w.ready.Add(1)
	return w.Workflows.Ready(ctx)
}

// TestReadyzNamesTheFailingDependencyOnly: the errors of a failed check carry hosts, users
// and queue names; /readyz is unauthenticated, so it says only which dependency is down.
func TestReadyzNamesTheFailingDependencyOnly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		dbErr, tempErr error
		status         int
		want           map[string]string
	}{
		{"both ok", nil, nil, 200, map[string]string{"database": "ok", "temporal": "ok"}},
		{"database down", errors.New(`failed to connect to host=db.internal user=kasa_app database=kasa`), nil,
			503, map[string]string{"database": "down", "temporal": "ok"}},
		{"temporal down", nil, errors.New(`dial tcp temporal.internal:7233: connection refused`),
			503, map[string]string{"database": "ok", "temporal": "down"}},
		// Temporal answers and no worker polls: the operator's fix is a worker, not Temporal.
		{"no worker", nil, fmt.Errorf(`%w %q`, workflows.ErrNoWorker, "payments-secret"),
			503, map[string]string{"database": "ok", "temporal": "no_worker"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, st, wf := newTestServer(t, nil)
			st.fail["Ping"], wf.ready = tc.dbErr, tc.tempErr
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			require.Equal(t, tc.status, rec.Code)
			var got map[string]string
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got), rec.Body.String())
			require.Equal(t, tc.want, got)
		})
	}
}

// TestReadyzIsCachedForASecond: each check costs a database round trip and two Temporal
// calls; a burst of probes shares one.
func TestReadyzIsCachedForASecond(t *testing.T) {
	t.Parallel()
	var cw *countingWorkflows
	s, st, _ := newTestServer(t, func(o *Options) {
		cw = &countingWorkflows{Workflows: o.Workflows}
		o.Workflows = cw
	})
	h := s.Handler()
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			require.Equal(t, http.StatusOK, rec.Code)
		})
	}
	wg.Wait()
	st.mu.Lock()
	pings := st.calls["Ping"]
	st.mu.Unlock()
	require.LessOrEqual(t, pings, 2, "database checks for 100 probes")
	require.LessOrEqual(t, int(cw.ready.Load()), 2, "Temporal checks for 100 probes")
}

// TestReadyzLogsTheCauseOncePerChange: the detail kept out of the answer is in the log, once
// while it stays the same, and the recovery is logged too.
func TestReadyzLogsTheCauseOncePerChange(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	s, st, _ := newTestServer(t, func(o *Options) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	probe := func() string {
		s.ready.mu.Lock()
		s.ready.checked = time.Time{} // past the cache
		s.ready.mu.Unlock()
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Body.String()
	}
	st.mu.Lock()
	st.fail["Ping"] = errors.New("dial tcp db.internal:5432: connection refused")
	st.mu.Unlock()
	for range 3 {
		require.NotContains(t, probe(), "db.internal")
	}
	require.Equal(t, 1, strings.Count(logs.String(), "readiness: database down"), logs.String())
	require.Contains(t, logs.String(), "db.internal:5432")
	st.mu.Lock()
	delete(st.fail, "Ping")
	st.mu.Unlock()
	require.Contains(t, probe(), `"database":"ok"`)
	require.Contains(t, logs.String(), "readiness: database ok again")
}

// fakeAttributes answers MissingSearchAttributes with missing (under mu) and counts the calls.
type fakeAttributes struct {
	mu      sync.Mutex
	missing []string
	err     error
	calls   int
}

func (a *fakeAttributes) MissingSearchAttributes(context.Context) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	return a.missing, a.err
}

func (a *fakeAttributes) set(missing []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.missing = missing
}

func (a *fakeAttributes) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}

// TestReadyzSaysWhenSearchAttributesAreMissing: on a namespace without the workflows' search
// attributes every start fails, so the API is not ready, and says why without naming them.
func TestReadyzSaysWhenSearchAttributesAreMissing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		missing []string
		err     error
		status  int
		want    string
	}{
		{"registered", nil, nil, 200, "ok"},
		{"missing", []string{"MerchantId", "PaymentStatus"}, nil, 503, "missing"},
		{"cannot tell", nil, errors.New("list search attributes: unavailable"), 503, "down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			attrs := &fakeAttributes{missing: tc.missing, err: tc.err}
			s, _, _ := newTestServer(t, func(o *Options) {
				o.SearchAttributes = attrs
				o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			})
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			require.Equal(t, tc.status, rec.Code)
			var got map[string]string
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got), rec.Body.String())
			require.Equal(t, map[string]string{"database": "ok", "temporal": "ok", "search_attributes": tc.want}, got)
			for _, name := range tc.missing {
				require.Contains(t, logs.String(), name, "the log names what is missing")
			}
		})
	}
}

// TestReadyzRechecksMissingSearchAttributesOnly: registered attributes stay so (only an operator
// removes them), so they are asked for once a minute; missing ones at every check, so that the
// API is ready within a second of `kasa migrate`.
func TestReadyzRechecksMissingSearchAttributesOnly(t *testing.T) {
	t.Parallel()
	attrs := &fakeAttributes{missing: []string{"MerchantId"}}
	s, _, _ := newTestServer(t, func(o *Options) { o.SearchAttributes = attrs })
	probe := func() int {
		s.ready.mu.Lock()
		s.ready.checked = time.Time{} // past the one-second cache
		s.ready.mu.Unlock()
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code
	}
	for range 3 {
		require.Equal(t, http.StatusServiceUnavailable, probe())
	}
	require.Equal(t, 3, attrs.count(), "missing attributes are looked for at every check")
	attrs.set(nil)
	for range 3 {
		require.Equal(t, http.StatusOK, probe())
	}
	require.Equal(t, 4, attrs.count(), "registered attributes are not asked for again within a minute")
	s.ready.mu.Lock()
	s.ready.attrsOK = time.Now().Add(-searchAttributesTTL)
	s.ready.mu.Unlock()
	require.Equal(t, http.StatusOK, probe())
	require.Equal(t, 5, attrs.count(), "after a minute they are asked for again")
}
