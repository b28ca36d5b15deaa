package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseStat(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		line string
		want proc
		ok   bool
	}{
		{"42 (postgres) S 7 42 42 0 -1 4194560 100 0 0 0 150 25 3 4 20 0 1 0 100 1000 10 18446744073709551615",
			proc{comm: "postgres", ppid: 7, own: 1750 * time.Millisecond, children: 70 * time.Millisecond}, true},
		// A command name may hold spaces and parentheses: the fields count from its last ')'.
		{"9 (a (b) c) R 1 9 9 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0",
			proc{comm: "a (b) c", ppid: 1, own: 30 * time.Millisecond}, true},
		{"9 (short) R 1 9", proc{}, false},
		{"no parentheses at all", proc{}, false},
		{"9 (x) R 1 9 9 0 -1 0 0 0 0 0 ten 2 0 0 20", proc{}, false},
	} {
		got, ok := parseStat(c.line)
		require.Equal(t, c.ok, ok, c.line)
		require.Equal(t, c.want, got, c.line)
	}
}

func TestCPUWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	clock := func() map[string]time.Duration { return map[string]time.Duration{"x": time.Since(t0), "idle": 0} }
	from := time.Now().Add(50 * time.Millisecond)
	used := cpuWindow(context.Background(), clock, from, from.Add(200*time.Millisecond))()
	require.Greater(t, used["x"], 150*time.Millisecond, "the time between the two samples: about the window")
	require.Less(t, used["x"], time.Second)
	require.NotContains(t, used, "idle", "a class that used nothing is left out")

	ctx, cancel := context.WithCancel(context.Background())
	wait := cpuWindow(ctx, clock, time.Now(), time.Now().Add(time.Hour))
	cancel()
	require.Nil(t, wait(), "a cancelled window ends at once, without a measurement")
	require.Nil(t, cpuWindow(context.Background(), nil, time.Now(), time.Now())())
}

func TestCPUUse(t *testing.T) {
	t.Parallel()
	u := cpuUse(map[string]time.Duration{ClassKasa: 400 * time.Millisecond, ClassPostgres: 200 * time.Millisecond}, 2*time.Second, "new payment", 100)
	require.Equal(t, &CPUUse{Per: "new payment", MS: map[string]float64{ClassKasa: 4, ClassPostgres: 2}, Cores: 0.3}, u)
	require.Equal(t, "6.00 ms per new payment: kasa 4.00, postgres 2.00", u.String())
	require.Nil(t, cpuUse(nil, time.Second, "request", 10))
	require.Nil(t, cpuUse(map[string]time.Duration{ClassKasa: time.Second}, time.Second, "request", 0))
}
