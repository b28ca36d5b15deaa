package store

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// ReconciliationRun is one finished reconciliation, as kept in reconciliation_runs.
type ReconciliationRun struct {
	ID                 uuid.UUID
	Source             string // "cli" or "api"
	Days               []time.Time
	Lines              int
	Matched            int
	ResolvedCharged    int
	ResolvedNotCharged int
	Pending            int
	Mismatches         int
	Report             []byte // the JSON report
}

// ReconcileTotals are the reconciliation outcome counters, summed over every run.
type ReconcileTotals struct {
	Runs, Lines, Matched, ResolvedCharged, ResolvedNotCharged, Pending, Mismatches int64
	LastRun                                                                        time.Time // zero when none
	LastMismatches                                                                 int64     // mismatches of the latest run
}

const sqlRecordReconciliation = `INSERT INTO reconciliation_runs
(id, source, days, lines, matched, resolved_charged, resolved_not_charged, pending, mismatches, report)
VALUES ($1, $2, $3::date[], $4, $5, $6, $7, $8, $9, $10)`

// RecordReconciliation keeps a finished run.
func (s *Store) RecordReconciliation(ctx context.Context, r ReconciliationRun) error {
	_, err := s.pool.Exec(ctx, sqlRecordReconciliation, r.ID, r.Source, r.Days, r.Lines, r.Matched,
		r.ResolvedCharged, r.ResolvedNotCharged, r.Pending, r.Mismatches, r.Report)
	return translate(err)
}

// One row a day or so: summing them at scrape time is cheap for decades.
const sqlReconcileTotals = `SELECT count(*), coalesce(sum(lines), 0), coalesce(sum(matched), 0),
  coalesce(sum(resolved_charged), 0), coalesce(sum(resolved_not_charged), 0), coalesce(sum(pending), 0),
  coalesce(sum(mismatches), 0), coalesce(max(finished_at), 'epoch'),
  coalesce((SELECT mismatches FROM reconciliation_runs ORDER BY finished_at DESC, id DESC LIMIT 1), 0)
FROM reconciliation_runs`

// ReconcileTotals reads the outcome counters.
func (s *Store) ReconcileTotals(ctx context.Context) (ReconcileTotals, error) {
	var t ReconcileTotals
	err := s.pool.QueryRow(ctx, sqlReconcileTotals).Scan(&t.Runs, &t.Lines, &t.Matched, &t.ResolvedCharged,
		&t.ResolvedNotCharged, &t.Pending, &t.Mismatches, &t.LastRun, &t.LastMismatches)
	if t.LastRun.Unix() == 0 {
		t.LastRun = time.Time{}
	}
	return t, translate(err)
}
