package store

import (
	"context"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
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

// RecordReconciliation keeps a finished run.
func (s *Store) RecordReconciliation(ctx context.Context, r ReconciliationRun) error {
	_, err := s.pool.Exec(ctx, dbsqlc.InsertReconciliationRun, r.ID, r.Source, r.Days, r.Lines, r.Matched,
		r.ResolvedCharged, r.ResolvedNotCharged, r.Pending, r.Mismatches, r.Report)
	return translate(err)
}

// ReconcileTotals reads the outcome counters.
func (s *Store) ReconcileTotals(ctx context.Context) (ReconcileTotals, error) {
	var t ReconcileTotals
	err := s.pool.QueryRow(ctx, dbsqlc.ReconcileTotals).Scan(&t.Runs, &t.Lines, &t.Matched, &t.ResolvedCharged,
		&t.ResolvedNotCharged, &t.Pending, &t.Mismatches, &t.LastRun, &t.LastMismatches)
	if t.LastRun.Unix() == 0 {
		t.LastRun = time.Time{}
	}
	return t, translate(err)
}
