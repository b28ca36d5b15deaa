package store

import "context"

// ReportCounts are read-only figures the benchmark reports: every payment, and the rows left in
// the tables retention empties after their windows (idempotency records, outbox, inbox, webhook
// deliveries). They count whole tables: for a benchmark's throwaway database, not a live one.
type ReportCounts struct {
	Payments int64
	Windowed int64
}

// ReportCounts reads the counts.
func (s *Store) ReportCounts(ctx context.Context) (ReportCounts, error) {
	row, err := s.q.ReportCounts(ctx)
	return ReportCounts{Payments: row.Payments, Windowed: row.Windowed}, translate(err)
}
