package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReservationCloseIsHOT: closing a reservation changes no indexed column, so PostgreSQL
// updates it in place (a HOT update: no new index entries), and kasa verify still sums the
// active reservations without an index of their own.
func TestReservationCloseIsHOT(t *testing.T) {
	ctx := context.Background()
	hot := func() int64 {
		var n int64
		require.NoError(t, db.QueryRow(ctx, `SELECT coalesce(n_tup_hot_upd, 0) FROM pg_stat_user_tables WHERE relname = 'balance_reservations'`, nil, &n))
		return n
	}
	before := hot()
	mID, aID := fixture(t, 10_000)
	for range 5 {
		settle(t, mID, aID, false)
	}
	// The statistics reach the shared counters when a backend goes idle, within a second.
	require.Eventually(t, func() bool { return hot() > before }, 10*time.Second, 100*time.Millisecond,
		"no reservation was closed by a HOT update")
	requireVerified(t)
}
