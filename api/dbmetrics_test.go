package api

import (
	"context"
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
