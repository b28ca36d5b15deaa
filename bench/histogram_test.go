package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBucketBounds(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		v := int64(math.Exp(rng.Float64() * math.Log(float64(int64(1)<<maxBits))))
		lower, width := bucketBounds(bucketOf(v))
		require.LessOrEqual(t, lower, v)
		require.Less(t, v, lower+width)
		if v >= subCount {
			require.LessOrEqual(t, float64(width)/float64(lower), 1.0/halfCount, "bucket of %d too wide", v)
		}
	}
	require.Equal(t, numBuckets-1, bucketOf(math.MaxInt64))
	require.Equal(t, 0, bucketOf(-5))
}

func TestHistogramQuantiles(t *testing.T) {
	t.Parallel()
	logUniform := func(rng *rand.Rand) time.Duration { // 10µs to 60s, every decade equally
		return time.Duration(math.Exp(math.Log(1e4) + rng.Float64()*(math.Log(6e10)-math.Log(1e4))))
	}
	tests := []struct {
		name string
		n    int
		gen  func(*rand.Rand) time.Duration
	}{
		{"log-uniform 10us..60s", 200_000, logUniform},
		{"normal around 5ms", 100_000, func(r *rand.Rand) time.Duration {
			return time.Duration(max(5e6+r.NormFloat64()*1e6, 1e4))
		}},
		{"exponential tail mean 20ms", 100_000, func(r *rand.Rand) time.Duration {
			return time.Duration(1e5 + r.ExpFloat64()*2e7)
		}},
		{"few samples", 7, logUniform},
		{"one sample", 1, logUniform},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(42, uint64(tt.n)))
			var h histogram
			ref := make([]time.Duration, tt.n)
			for i := range ref {
				ref[i] = tt.gen(rng)
				h.record(ref[i])
			}
			slices.Sort(ref)
			require.Equal(t, int64(tt.n), h.count())
			require.Equal(t, ref[len(ref)-1], h.maximum(), "max is exact")
			for _, q := range []float64{0, 0.5, 0.9, 0.95, 0.99, 0.999, 1} {
				rank := max(int(math.Ceil(q*float64(tt.n))), 1)
				want := float64(ref[rank-1])
				got := float64(h.quantile(q))
				require.InEpsilon(t, want, got, 0.01, "q=%v", q)
			}
		})
	}
}

func TestHistogramMerge(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 7))
	var all histogram
	parts := make([]histogram, 4)
	for i := range 40_000 {
		d := time.Duration(rng.Int64N(int64(2 * time.Second)))
		all.record(d)
		parts[i%4].record(d)
	}
	var merged histogram
	for i := range parts {
		merged.merge(&parts[i])
	}
	require.Equal(t, all.count(), merged.count())
	require.Equal(t, all.maximum(), merged.maximum())
	for _, q := range []float64{0.5, 0.9, 0.99} {
		require.Equal(t, all.quantile(q), merged.quantile(q))
	}
	var empty histogram
	require.Zero(t, empty.quantile(0.99))
}
