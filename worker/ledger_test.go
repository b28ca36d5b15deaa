package worker

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

type verifier struct {
	problems []string
	err      error
}

func (v *verifier) Verify(context.Context) ([]string, error) { return v.problems, v.err }

// Until a check has ended, the count of violations is not known: a restarted worker must not
// read 0 (all clear) over the violations its last run found, before its first check says so.
func TestLedgerViolationsUnknownUntilTheFirstCheck(t *testing.T) {
	v := &verifier{err: errors.New("database down")}
	c := NewLedgerCheck(v, 0, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.True(t, math.IsNaN(gauge(t, c.violations)), "no check yet")
	c.Check(context.Background())
	require.True(t, math.IsNaN(gauge(t, c.violations)), "a failed check says nothing")
	v.err, v.problems = nil, []string{"a", "b"}
	c.Check(context.Background())
	require.Equal(t, 2.0, gauge(t, c.violations))
	v.problems = nil
	c.Check(context.Background())
	require.Zero(t, gauge(t, c.violations))
}

func gauge(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, g.Write(&m))
	return m.GetGauge().GetValue()
}
