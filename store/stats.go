package store

import (
	"context"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
	"time"

	"github.com/jackc/pgx/v5"
)

// Stats are the database-derived health figures the metrics endpoint exports.
type Stats struct {
	UnknownCount   int64     // unknown payments
	UnknownRefunds int64     // unknown refunds
	OldestUnknown  time.Time // of payments and refunds; zero when there is none
	OutboxBacklog  int64
	OldestOutbox   time.Time // zero when there is none
	// Now is the database's clock when the figures were read, which stamped the oldest times
	// above: their ages are taken from it, never from a host's clock.
	Now time.Time
	// Stuck counts payments flagged by their workflow as needing an operator, and payments
	// still processing after StuckAfter (their workflow is gone or cannot go on).
	Stuck int64
	// StuckRefunds counts refunds the same way.
	StuckRefunds int64
	// OpenAuthorizations are manual payments' authorizations that hold money; the overdue ones
	// are still open a minute after their capture_before.
	OpenAuthorizations, OverdueAuthorizations int64
	Reconcile                                 ReconcileTotals
	// LockWaits counts sessions waiting for a lock, by what they wait on: a table's name for
	// table and tuple locks, "transactionid" for a row held by another transaction (a hot row).
	LockWaits map[string]int64
	// HotAccountPostings is how many ledger entries the busiest account got in the last
	// minute, and HotAccountShare its share of all entries then (0 when there were none).
	HotAccountPostings int64
	HotAccountShare    float64
	Tables             []TableSize // every table's size and its indexes' size
}

// StuckAfter is how long a payment may stay processing before it counts as stuck: far beyond
// every charge strategy's budget.
const StuckAfter = time.Hour

// Stats reads the figures; the counts use partial indexes, so this stays cheap.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	var st Stats
	err := s.pool.QueryRow(ctx, dbsqlc.Stats, StuckAfter.Seconds()).Scan(&st.UnknownCount, &st.OldestUnknown, &st.OutboxBacklog, &st.OldestOutbox, &st.Stuck,
		&st.UnknownRefunds, &st.StuckRefunds, &st.OpenAuthorizations, &st.OverdueAuthorizations, &st.Now)
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
	err = s.pool.QueryRow(ctx, dbsqlc.HotAccount, minUUIDv7(time.Now().Add(-time.Minute))).Scan(&st.HotAccountPostings, &total)
	if total > 0 {
		st.HotAccountShare = float64(st.HotAccountPostings) / float64(total)
	}
	if err != nil {
		return st, translate(err)
	}
	st.Tables, err = s.Sizes(ctx)
	return st, err
}

func (s *Store) lockWaits(ctx context.Context) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, queryLockWaits)
	if err != nil {
		return nil, translate(err)
	}
	out := map[string]int64{}
	var name string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error { out[name] = n; return nil })
	return out, translate(err)
}
