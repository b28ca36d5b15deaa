package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// Every API's sweeper reads, every few seconds, the records whose workflow no run has taken on
// yet (no first step) and whose lease ran out: the ones it takes over, again every lease while
// their runs have taken no step. It reads the open records through their index, never the
// records of every payment finished. Planned for the values and for any values.
func TestStrandedReadsTheOpenRecordsIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{})
	// 20,000 finished payments' records, 1,000 in flight (their first step ran) and 3 stranded.
	require.NoError(t, own.Exec(ctx, `INSERT INTO idempotency_records (merchant_id, idempotency_key, request_hash, status,
			operation_id, workflow_started, locked_until)
		SELECT $1, 'k' || g, repeat('0', 64), CASE WHEN g <= 20000 THEN 'completed' ELSE 'processing' END,
			gen_random_uuid(), g <= 21000, CASE WHEN g > 21000 THEN now() - interval '1 minute' END
		FROM generate_series(1, 21003) g`, m.ID))
	require.NoError(t, own.Exec(ctx, `ANALYZE idempotency_records`))

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, generic := range []bool{false, true} {
		for _, merchant := range []string{"NULL", fmt.Sprintf("'%s'", m.ID)} {
			t.Run(fmt.Sprintf("generic=%v/merchant=%s", generic, merchant), func(t *testing.T) {
				plan, raw := planOf(t, conn, generic, true, store.QueryStranded, merchant+`, 100`)
				rows := 0.0
				plan.walk(func(n analyzedNode) {
					if n.RelationName == "idempotency_records" {
						require.NotEqual(t, "Seq Scan", n.NodeType, "records are never read whole: plan %s", raw)
					}
					if n.NodeType == "Limit" {
						rows = n.ActualRows
					}
				})
				require.Equal(t, 3.0, rows, "plan %s", raw)
			})
		}
	}
}
