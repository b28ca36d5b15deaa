package bench

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The payday reads the backlog once per interval, not faster (each read counts every record),
// and the drain ends at the first read after the burst that finds nothing processing.
func TestBacklogWatchReadsRarelyAndFindsTheDrain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var reads atomic.Int64
	processing := []int64{30, 20, 10, 0, 0, 0}
	read := func(context.Context) (int64, int64, error) {
		i := min(int(reads.Add(1))-1, len(processing)-1)
		return processing[i] / 2, processing[i], nil
	}
	const every = 50 * time.Millisecond
	start := time.Now()
	w := watchBacklog(ctx, read, start, every)
	time.Sleep(every / 2) // the burst: it ends after the first read
	ended := time.Now()
	final, err := w.drained(ctx, ended, time.Minute)
	require.NoError(t, err)
	samples := w.stop()
	require.GreaterOrEqual(t, len(samples), 4)
	require.Equal(t, []int64{30, 20, 10, 0}, []int64{samples[0].Processing, samples[1].Processing, samples[2].Processing, samples[3].Processing})
	require.Equal(t, int64(15), samples[0].Queued)
	drainedAt := start.Add(time.Duration(samples[3].At * float64(time.Second)))
	require.WithinDuration(t, drainedAt, final, time.Millisecond, "the drain ends when the first empty read was made")
	require.GreaterOrEqual(t, final.Sub(start), 3*every, "the fourth read comes three intervals after the first")
	n := reads.Load()
	time.Sleep(3 * every)
	require.Equal(t, n, reads.Load(), "no read after stop")
}

func TestBacklogWatchGivesUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	busy := func(context.Context) (int64, int64, error) { return 5, 7, nil }
	w := watchBacklog(ctx, busy, time.Now(), 10*time.Millisecond)
	_, err := w.drained(ctx, time.Now(), 50*time.Millisecond)
	require.ErrorContains(t, err, "7 payments still processing")
	w.stop()

	failing := func(context.Context) (int64, int64, error) { return 0, 0, errors.New("connection refused") }
	w = watchBacklog(ctx, failing, time.Now(), 10*time.Millisecond)
	_, err = w.drained(ctx, time.Now(), time.Minute)
	require.ErrorContains(t, err, "connection refused", "a failed read ends the wait")
	require.Empty(t, w.stop())
}
