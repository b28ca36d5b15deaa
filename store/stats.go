package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Stats are the database-derived health figures of the seed's metrics table.
type Stats struct {
	UnknownCount  int64
	OldestUnknown time.Time // zero when there is none
	OutboxBacklog int64
	OldestOutbox  time.Time // zero when there is none
	Reconcile     ReconcileTotals
	// LockWaits counts sessions waiting for a lock, by what they wait on: a table's name for
	// table and tuple locks, "transactionid" for a row held by another transaction (a hot row).
	LockWaits map[string]int64
	// HotAccountPostings is how many ledger entries the busiest account got in the last
	// minute, and HotAccountShare its share of all entries then (0 when there were none).
	HotAccountPostings int64
	HotAccountShare    float64
	Tables             []TableSize // index_size of the seed's table, and the tables' own
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
	if st.Reconcile, err = s.ReconcileTotals(ctx); err != nil {
		return st, err
	}
	if st.LockWaits, err = s.lockWaits(ctx); err != nil {
		return st, err
	}
	var total int64
	err = s.pool.QueryRow(ctx, sqlHotAccount, minUUIDv7(time.Now().Add(-time.Minute))).Scan(&st.HotAccountPostings, &total)
	if total > 0 {
		st.HotAccountShare = float64(st.HotAccountPostings) / float64(total)
	}
	if err != nil {
		return st, translate(err)
	}
	st.Tables, err = s.Sizes(ctx)
	return st, err
}

const (
	// Only waits in this database; a row wait is on the holder's transaction id.
	sqlLockWaits = `SELECT coalesce(c.relname, l.locktype), count(DISTINCT l.pid)
FROM pg_locks l LEFT JOIN pg_class c ON c.oid = l.relation
WHERE NOT l.granted AND l.pid IN (SELECT pid FROM pg_stat_activity WHERE datname = current_database())
GROUP BY 1`
	// Entry ids are UUIDv7: the last minute is a primary-key range, however large the ledger.
	sqlHotAccount = `SELECT coalesce(max(n), 0), coalesce(sum(n), 0)
FROM (SELECT count(*) AS n FROM ledger_entries WHERE id >= $1 GROUP BY account_id) per_account`
)

func (s *Store) lockWaits(ctx context.Context) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, sqlLockWaits)
	if err != nil {
		return nil, translate(err)
	}
	out := map[string]int64{}
	var name string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { out[name] = n; return nil })
	return out, translate(err)
}
