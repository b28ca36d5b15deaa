package sweeper

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/workflows"
)

// The starter production passes the sweeper and the drainer can do what they look for: say
// whether a start made the run, and read a run (moving a stranded one). Should a signature
// drift, they would quietly do without.
var (
	_ runMover    = workflows.Starter{}
	_ refundMover = workflows.Starter{}
	_ creator     = workflows.Starter{}
	_ RunStarter  = workflows.Starter{}
)

func TestDrainRate(t *testing.T) {
	now := time.Now()
	every := func(n int, gap time.Duration) []time.Time {
		var out []time.Time
		for i := n; i > 0; i-- {
			out = append(out, now.Add(-time.Duration(i)*gap))
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		starts []time.Time
		want   float64
	}{
		{"none", nil, 0},
		{"a full window", every(1000, 10*time.Millisecond), 100},
		{"begun half a second ago: over a second", every(50, 10*time.Millisecond), 50},
		{"begun 2 s ago: over 2 s", every(200, 10*time.Millisecond), 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, drainRate(tc.starts, now), 0.5)
		})
	}
}
