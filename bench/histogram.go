package bench

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// The histogram is log-linear, like HdrHistogram: values (nanoseconds) below 2^subBits get one
// bucket each; above that every power of two is split into halfCount equal buckets. A bucket is
// then at most 1/halfCount = 0.78% of its lower bound wide, and reporting its midpoint keeps the
// error of any quantile under 0.4% over the whole range (1 ns to 2^maxBits ns ≈ 137 s), in a fixed
// 31 KiB whatever the number of samples.
const (
	subBits    = 8
	subCount   = 1 << subBits
	halfCount  = subCount / 2
	maxBits    = 37
	numBuckets = subCount + (maxBits-subBits)*halfCount
)

// histogram counts latencies. Counters are atomic so one histogram per second of the run can be
// shared by every client; the run's main histogram is still one per client (no cache-line
// ping-pong) and merged at the end.
type histogram struct {
	counts [numBuckets]atomic.Uint64
	total  atomic.Uint64
	max    atomic.Int64
}

func bucketOf(v int64) int {
	if v < subCount {
		return int(max(v, 0))
	}
	n := bits.Len64(uint64(v))
	if n > maxBits {
		return numBuckets - 1 // beyond the range: counted in the top bucket, max stays exact
	}
	shift := n - subBits
	return subCount + (shift-1)*halfCount + int(v>>shift) - halfCount
}

// bucketBounds returns the lowest value of bucket i and its width.
func bucketBounds(i int) (lower, width int64) {
	if i < subCount {
		return int64(i), 1
	}
	j := i - subCount
	shift := j/halfCount + 1
	return int64(j%halfCount+halfCount) << shift, 1 << shift
}

func (h *histogram) record(d time.Duration) {
	v := int64(d)
	h.counts[bucketOf(v)].Add(1)
	h.total.Add(1)
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			return
		}
	}
}

func (h *histogram) merge(o *histogram) {
	for i := range o.counts {
		if c := o.counts[i].Load(); c > 0 {
			h.counts[i].Add(c)
		}
	}
	h.total.Add(o.total.Load())
	if m := o.max.Load(); m > h.max.Load() {
		h.max.Store(m)
	}
}

func (h *histogram) count() int64 { return int64(h.total.Load()) }

func (h *histogram) maximum() time.Duration { return time.Duration(h.max.Load()) }

// quantile returns the value below or at which a share q of the samples lie (the sample of rank
// ceil(q·n)), as the midpoint of its bucket; 0 without samples.
func (h *histogram) quantile(q float64) time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	rank = min(max(rank, 1), n)
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			lower, width := bucketBounds(i)
			return min(time.Duration(lower+(width-1)/2), h.maximum())
		}
	}
	return h.maximum()
}

// latency is the report's quantiles of h.
func (h *histogram) latency() Latency {
	return Latency{
		P50: ms(h.quantile(0.50)), P90: ms(h.quantile(0.90)), P95: ms(h.quantile(0.95)),
		P99: ms(h.quantile(0.99)), Max: ms(h.maximum()),
	}
}
