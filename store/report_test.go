package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// ReportCounts counts every payment, and the rows that retention empties: a payment settled
// through the store's steps adds one payment and its idempotency record and outbox events.
// Not parallel: the retention and purge tests delete rows of those tables.
func TestReportCounts(t *testing.T) {
	ctx := context.Background()
	before, err := db.ReportCounts(ctx)
	require.NoError(t, err)
	mID, aID := fixture(t, 10_000)
	settle(t, mID, aID, false)
	after, err := db.ReportCounts(ctx)
	require.NoError(t, err)
	require.Equal(t, before.Payments+1, after.Payments)
	require.GreaterOrEqual(t, after.Windowed, before.Windowed+2, "an idempotency record and at least one outbox event")
}
