package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCPUBetween(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	clock := func() map[string]time.Duration { return map[string]time.Duration{"x": time.Since(t0), "idle": 0} }
	from := time.Now().Add(50 * time.Millisecond)
	used := cpuBetween(context.Background(), clock, from, from.Add(200*time.Millisecond))
	require.Greater(t, used["x"], 150*time.Millisecond, "the time between the two samples: about the window")
	require.Less(t, used["x"], time.Second)
	require.NotContains(t, used, "idle", "a class that used nothing is left out")

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	require.Nil(t, cpuBetween(ctx, clock, time.Now(), time.Now().Add(time.Hour)), "a cancelled window gives no measurement")
	require.Less(t, time.Since(start), 10*time.Second, "a cancelled window ends at once")
	require.Nil(t, cpuBetween(context.Background(), nil, time.Now(), time.Now()))
}

func TestCPUUse(t *testing.T) {
	t.Parallel()
	u := cpuUse(map[string]time.Duration{ClassKasa: 400 * time.Millisecond, ClassPostgres: 200 * time.Millisecond}, 2*time.Second, "new payment", 100)
	require.Equal(t, &CPUUse{Per: "new payment", MS: map[string]float64{ClassKasa: 4, ClassPostgres: 2}, Cores: 0.3}, u)
	require.Nil(t, cpuUse(nil, time.Second, "request", 10))
	require.Nil(t, cpuUse(map[string]time.Duration{ClassKasa: time.Second}, time.Second, "request", 0))
}
