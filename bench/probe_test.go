package bench

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestProbeCounts(t *testing.T) {
	t.Parallel()
	require.Greater(t, Probe(20*time.Millisecond), 0.0)
}

func TestSteadinessWaitsForSlowSpells(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		probes []float64
		budget time.Duration
		until  time.Time
		want   []float64 // what each wait returns
		polls  int       // probes taken
	}{
		{name: "steady", probes: []float64{100, 95, 90}, budget: time.Second, want: []float64{100, 95, 90}, polls: 3},
		{name: "slow spell passes", probes: []float64{100, 50, 60, 85}, budget: time.Second, want: []float64{100, 85}, polls: 4},
		{name: "budget runs out", probes: []float64{100, 50, 40, 30}, budget: 2 * time.Millisecond, want: []float64{100, 30}, polls: 4},
		{name: "no budget", probes: []float64{100, 50}, budget: 0, want: []float64{100, 50}, polls: 2},
		{name: "too late in the suite", probes: []float64{100, 50}, budget: time.Second, until: time.Now().Add(-time.Second), want: []float64{100, 50}, polls: 2},
		{name: "a faster machine raises the bar", probes: []float64{100, 200, 150, 170}, budget: time.Second, want: []float64{100, 200, 170}, polls: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			polls := 0
			s := &steadiness{
				probe:    func() float64 { polls++; return tc.probes[polls-1] },
				budget:   tc.budget,
				until:    tc.until,
				pause:    time.Millisecond,
				slow:     0.8,
				progress: func(string, ...any) {},
			}
			var got []float64
			for range tc.want {
				p, err := s.wait(context.Background())
				require.NoError(t, err)
				got = append(got, p)
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.polls, polls)
		})
	}
}

// The probe waits for the previous run's tail to finish, and a cancelled suite does not probe.
func TestSteadinessProbesAfterTheQuietGap(t *testing.T) {
	t.Parallel()
	var probedAfter time.Duration
	start := time.Now()
	s := &steadiness{
		probe:    func() float64 { probedAfter = time.Since(start); return 100 },
		budget:   time.Second,
		pause:    time.Millisecond,
		quiet:    50 * time.Millisecond,
		slow:     0.8,
		progress: func(string, ...any) {},
	}
	p, err := s.wait(context.Background())
	require.NoError(t, err)
	require.Equal(t, 100.0, p)
	require.GreaterOrEqual(t, probedAfter, 50*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	probedAfter = 0
	_, err = s.wait(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, probedAfter, "no probe once the suite is cancelled")
}

func TestSuiteReportNamesSlowRuns(t *testing.T) {
	t.Parallel()
	rep := &Report{Correct: true}
	for i, probe := range []float64{1000, 950, 500, 0} {
		r := sampleResult(fmt.Sprintf("run %d", i), 2)
		r.Probe = probe
		rep.Runs = append(rep.Runs, r)
	}
	var b bytes.Buffer
	require.NoError(t, WriteSuiteMarkdown(&b, rep))
	out := b.String()
	require.Contains(t, out, "**The machine was slow during some runs**")
	require.Contains(t, out, ": #3 (50%).")
	require.Contains(t, out, "| 0 | 95% |")
	require.Contains(t, out, "| 0 | - |")
	require.NotContains(t, out, "Provider capability", "no capability recorded, none claimed")

	rep.Capability = "none"
	b.Reset()
	require.NoError(t, WriteSuiteMarkdown(&b, rep))
	require.Contains(t, b.String(), "Provider capability: none. kasa's workflow shape for a payment that succeeds at its first charge, by provider capability: "+
		"`idempotent` LLL+eager+search-attributes, `inquiry` LLL+eager+search-attributes, `none` LLL+eager+search-attributes.")
}
