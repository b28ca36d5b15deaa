package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// TableSize is one table's footprint.
type TableSize struct {
	Table      string
	Rows       int64 // the planner's estimate (ANALYZE), else the statistics collector's live rows
	TableBytes int64 // pg_table_size: heap, TOAST, free space and visibility maps
	IndexBytes int64 // pg_indexes_size: every index of the table
}

// Sizes reports table and index bytes of kasa's tables (largest first) with row estimates;
// it reads catalog statistics only, so it is cheap on any table size.
func (s *Store) Sizes(ctx context.Context) ([]TableSize, error) {
	rows, err := s.pool.Query(ctx, queryTableSizes)
	if err != nil {
		return nil, translate(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TableSize, error) {
		var t TableSize
		err := r.Scan(&t.Table, &t.Rows, &t.TableBytes, &t.IndexBytes)
		return t, err
	})
	return out, translate(err)
}
