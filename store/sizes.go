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

const sqlSizes = `SELECT c.relname,
  CASE WHEN c.reltuples >= 0 THEN c.reltuples::bigint ELSE coalesce(st.n_live_tup, 0) END,
  pg_table_size(c.oid), pg_indexes_size(c.oid)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname <> 'goose_db_version'
ORDER BY pg_total_relation_size(c.oid) DESC, c.relname`

// Sizes reports table and index bytes of kasa's tables (largest first) with row estimates;
// it reads catalog statistics only, so it is cheap on any table size.
func (s *Store) Sizes(ctx context.Context) ([]TableSize, error) {
	rows, err := s.pool.Query(ctx, sqlSizes)
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
