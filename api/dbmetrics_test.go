package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
)

type fixedStats store.Stats

func (f fixedStats) Stats(context.Context) (store.Stats, error) { return store.Stats(f), nil }

// Unknown and stuck refunds are exported beside unknown and stuck payments, each on its own.
func TestDBMetricsCountRefundsApart(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newDBCollector(fixedStats{UnknownCount: 3, UnknownRefunds: 2, Stuck: 5, StuckRefunds: 1,
		OldestUnknown: time.Now().Add(-time.Minute)}))
	families, err := reg.Gather()
	require.NoError(t, err)
	var text strings.Builder
	for _, f := range families {
		_, err := expfmt.MetricFamilyToText(&text, f)
		require.NoError(t, err)
	}
	for _, line := range []string{"kasa_unknown_payments 3", "kasa_unknown_refunds 2", "kasa_payments_stuck 5", "kasa_refunds_stuck 1"} {
		require.Contains(t, text.String(), line+"\n")
	}
}

// Ages are taken from the database's clock, which stamped the oldest unknown payment and the
// oldest unpublished event: a scraped API host whose clock is minutes off would report ages
// minutes off, or below zero.
func TestDBMetricsAgesByTheDatabasesClock(t *testing.T) {
	for _, skew := range []time.Duration{-2 * time.Minute, 0, 2 * time.Minute} { // the database's clock ahead of this host's
		dbNow := time.Now().Add(skew)
		reg := prometheus.NewRegistry()
		reg.MustRegister(newDBCollector(fixedStats{UnknownCount: 1, OldestUnknown: dbNow.Add(-time.Hour),
			OutboxBacklog: 1, OldestOutbox: dbNow.Add(-10 * time.Second), Now: dbNow}))
		families, err := reg.Gather()
		require.NoError(t, err)
		got := map[string]float64{}
		for _, f := range families {
			if m := f.GetMetric(); len(m) == 1 && m[0].GetGauge() != nil {
				got[f.GetName()] = m[0].GetGauge().GetValue()
			}
		}
		require.InDelta(t, 3600, got["kasa_reconcile_age_seconds"], 1, "skew %s", skew)
		require.InDelta(t, 10, got["kasa_outbox_oldest_age_seconds"], 1, "skew %s", skew)
	}
}

type countingStats struct{ calls int }

func (c *countingStats) Stats(context.Context) (store.Stats, error) {
	c.calls++
	return store.Stats{UnknownCount: int64(c.calls)}, nil
}

// However often /metrics is scraped, the database figures are read at most once a second.
func TestDBMetricsAreReadAtMostOnceASecond(t *testing.T) {
	src := &countingStats{}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newDBCollector(src))
	for range 50 {
		_, err := reg.Gather()
		require.NoError(t, err)
	}
	require.Equal(t, 1, src.calls)
	time.Sleep(statsFresh + 50*time.Millisecond)
	_, err := reg.Gather()
	require.NoError(t, err)
	require.Equal(t, 2, src.calls, "a figure is at most a second old")
}

// downStats is a database that cannot answer: down, or too slow for the scrape.
type downStats struct{ *fakeStore }

func (downStats) Stats(context.Context) (store.Stats, error) {
	return store.Stats{}, errors.New("dial tcp 10.0.0.5:5432: connect: connection refused")
}

// While the database is down the API answers 503s: /metrics must still serve its own request
// counts (the 5xx rate of docs/deployment.md's alerts) and leave out only the figures it could
// not read, rather than fail as a whole and make the API look down to Prometheus.
func TestMetricsWithoutTheDatabase(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestServer(t, func(o *Options) { o.Store = downStats{o.Store.(*fakeStore)} })
	h := s.Handler()
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/healthz", nil))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.Contains(t, rec.Body.String(), `kasa_http_request_duration_seconds_count{method="GET",route="/healthz",status="200"} 1`)
	require.NotContains(t, rec.Body.String(), "kasa_unknown_payments", "no figure stands in for one the database did not give")
}
