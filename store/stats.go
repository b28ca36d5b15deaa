package store

import (
	"context"
	"time"
)

// Stats are the database-derived health figures of the seed's metrics table.
type Stats struct {
	UnknownCount  int64
	OldestUnknown time.Time // zero when there is none
	OutboxBacklog int64
	OldestOutbox  time.Time // zero when there is none
	Reconcile     ReconcileTotals
}

const sqlStats = `SELECT
  (SELECT count(*) FROM payments WHERE status = 'unknown'),
  (SELECT coalesce(min(updated_at), 'epoch') FROM payments WHERE status = 'unknown'),
  (SELECT count(*) FROM outbox WHERE published_at IS NULL),
  (SELECT coalesce(min(created_at), 'epoch') FROM outbox WHERE published_at IS NULL)`

// Stats reads the figures; both counts use partial indexes, so this stays cheap.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	err := s.pool.QueryRow(ctx, sqlStats).Scan(&st.UnknownCount, &st.OldestUnknown, &st.OutboxBacklog, &st.OldestOutbox)
	if st.OldestUnknown.Unix() == 0 {
		st.OldestUnknown = time.Time{}
	}
	if st.OldestOutbox.Unix() == 0 {
		st.OldestOutbox = time.Time{}
	}
	if err != nil {
		return st, translate(err)
	}
	st.Reconcile, err = s.ReconcileTotals(ctx)
	return st, err
}
