package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSampleBetween(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	var at []time.Time // when each sample was taken: a loaded machine may wake the sampler late
	clock := func() map[string]time.Duration {
		at = append(at, time.Now())
		return map[string]time.Duration{"x": at[len(at)-1].Sub(t0), "idle": 0}
	}
	var n int64
	counters := func(context.Context) (map[string]int64, error) { n += 7; return map[string]int64{"commits": n}, nil }
	from := time.Now().Add(50 * time.Millisecond)
	to := from.Add(200 * time.Millisecond)
	used, grew := sampleBetween(context.Background(), clock, counters, from, to)
	require.Len(t, at, 2, "one sample at each end of the window")
	require.False(t, at[0].Before(from), "the first sample is not taken before the window")
	require.False(t, at[1].Before(to), "the second sample is not taken before the window's end")
	require.Equal(t, at[1].Sub(at[0]), used["x"], "the time between the two samples")
	require.NotContains(t, used, "idle", "a class that used nothing is left out")
	require.Equal(t, map[string]int64{"commits": 7}, grew, "a counter's growth between the two samples")
	cpuBetween := func(ctx context.Context, cpu CPU, from, to time.Time) map[string]time.Duration {
		used, _ := sampleBetween(ctx, cpu, nil, from, to)
		return used
	}

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
	require.Equal(t, &CPUUse{Per: "new payment", MS: map[string]float64{ClassKasa: 4, ClassPostgres: 2}, Cores: 0.3,
		Own: OwnCPU{MS: 6, Postgres: 2, Target: OwnTarget}}, u, "no Temporal measured: no ratio")
	require.Nil(t, cpuUse(nil, time.Second, "request", 10))

	// kasa's own CPU: kasa's processes and the part of PostgreSQL that served kasa's database (its
	// backends, and the shared processes' time in proportion); never the simulator or Temporal.
	u = cpuUse(map[string]time.Duration{
		ClassKasa: 300 * time.Millisecond, ClassBanksim: 100 * time.Millisecond, ClassTemporal: 1000 * time.Millisecond,
		ClassPostgres: 600 * time.Millisecond, postgresKasa: 300 * time.Millisecond, postgresOthers: 100 * time.Millisecond,
	}, time.Second, "new payment", 100)
	require.Equal(t, &CPUUse{Per: "new payment",
		MS:    map[string]float64{ClassKasa: 3, ClassBanksim: 1, ClassTemporal: 10, ClassPostgres: 6},
		Cores: 2, PostgresBackends: map[string]float64{"kasa": 3, "others": 1},
		Own: OwnCPU{MS: 7.5, Postgres: 4.5, Ratio: 0.75, Target: OwnTarget, Met: false}}, u,
		"postgres: 3 of kasa's backends + 3/4 of the 2 shared; the parts are not classes: all is 20 ms")
	u = cpuUse(map[string]time.Duration{ClassKasa: 100 * time.Millisecond, ClassPostgres: 100 * time.Millisecond, ClassTemporal: 800 * time.Millisecond},
		time.Second, "new payment", 100)
	require.Equal(t, OwnCPU{MS: 2, Postgres: 1, Ratio: 0.25, Target: OwnTarget, Met: true}, u.Own,
		"without a split by database, all of PostgreSQL is kasa's")
	require.Nil(t, cpuUse(map[string]time.Duration{ClassKasa: time.Second}, time.Second, "request", 0))
}
