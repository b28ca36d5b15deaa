package worker

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type fakeDeleter struct {
	announced []time.Duration
	deletes   int
}

func (f *fakeDeleter) SeeRetention(_ context.Context, r time.Duration) error {
	f.announced = append(f.announced, r)
	return nil
}

func (f *fakeDeleter) DeleteExpiredRecords(context.Context, time.Duration, int) (int64, error) {
	f.deletes++
	return 0, nil
}

// A deleter announces its retention at every pass and deletes by it only once it has announced it
// for RetentionLead (every API has read it by then), again after a gap the APIs may have taken
// for its end.
func TestRecordRetentionAnnouncesBeforeDeleting(t *testing.T) {
	d := &fakeDeleter{}
	r := NewRecordRetention(d, time.Hour, RetentionInterval, 10, nil, slog.New(slog.DiscardHandler))
	now := time.Now()
	r.now = func() time.Time { return now }
	pass := func(after time.Duration) int {
		now = now.Add(after)
		before := d.deletes
		r.Pass(context.Background())
		return d.deletes - before
	}
	require.Zero(t, pass(0), "the first pass only announces")
	require.Zero(t, pass(RetentionLead-time.Second))
	require.Equal(t, 1, pass(time.Second), "announced for RetentionLead: it deletes")
	require.Equal(t, 1, pass(RetentionInterval))
	require.Zero(t, pass(RetentionLive), "after a gap it announces again first")
	require.Equal(t, 1, pass(RetentionLead))
	require.Len(t, d.announced, 6)
	require.Equal(t, time.Hour, d.announced[0])
}
