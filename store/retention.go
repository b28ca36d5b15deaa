package store

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// DeleteExpiredRecords deletes the idempotency records of finished operations (status completed)
// that finished more than retention ago, batch rows per statement, each its own short
// transaction, oldest operations first, and returns how many it deleted. Records of open
// operations (processing, unknown, a manual payment waiting for its capture) are kept whatever
// their age. Several callers may run at once:
// each batch skips the rows another caller holds, so they share the work instead of waiting on
// each other. Payments, refunds and the ledger are not touched: a request with an expired key is
// a new request, and the business key still guards the invoice. Each batch first announces the
// retention it deletes by (SeeRetention): however long a backlog takes, the APIs keep bounding
// their replay caches by it. It also wipes the sealed answers of merchant creations older than
// retention (CreateMerchantOnce).
func (s *Store) DeleteExpiredRecords(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	// The secrets a merchant's creation keeps for its replays are kept no longer than the
	// idempotency records (a few rows: one statement).
	if _, err := s.q.ForgetCreationAnswers(ctx, retention.Seconds()); err != nil {
		return 0, translate(err)
	}
	var total int64
	after := uuid.Nil
	for {
		start := time.Now()
		if err := s.SeeRetention(ctx, retention); err != nil {
			return total, err
		}
		row, err := s.q.DeleteExpiredRecords(ctx, dbsqlc.DeleteExpiredRecordsParams{
			RetentionSeconds: retention.Seconds(), After: after, MaxRows: int32(batch),
		})
		if err != nil {
			return total, translate(err)
		}
		total += int64(row.Deleted)
		if int(row.Deleted) < batch {
			return total, nil
		}
		after = row.Last
		// A backlog (after downtime, or a first run on a full table) is worked off at a fifth
		// of one backend's time, so the payment path keeps its rate meanwhile; that still
		// deletes several times a payday's peak of expiring records.
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(4 * time.Since(start)):
		}
	}
}

// SeeRetention announces that this process deletes idempotency records older than retention.
func (s *Store) SeeRetention(ctx context.Context, retention time.Duration) error {
	return translate(s.q.SeeRetention(ctx, retention.Milliseconds()))
}

// ShortestRetention is the shortest retention a deleter announced within live (0: none did), and
// the database's clock as it read it: the deleters expire records by that clock, not a caller's.
func (s *Store) ShortestRetention(ctx context.Context, live time.Duration) (time.Duration, time.Time, error) {
	row, err := s.q.ShortestRetentionMS(ctx, live.Seconds())
	return time.Duration(row.ShortestMs) * time.Millisecond, row.Now, translate(err)
}
