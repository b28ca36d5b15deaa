package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for goose
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// TestReservationCloseIsHOT: closing a reservation changes no indexed column, so PostgreSQL
// updates it in place (a HOT update: no new index entries), and kasa verify still sums the
// active reservations without an index of their own.
func TestReservationCloseIsHOT(t *testing.T) {
	ctx := context.Background()
	hot := func() int64 {
		var n int64
		require.NoError(t, db.QueryRow(ctx, `SELECT coalesce(n_tup_hot_upd, 0) FROM pg_stat_user_tables WHERE relname = 'balance_reservations'`, nil, &n))
		return n
	}
	before := hot()
	mID, aID := fixture(t, 10_000)
	for range 5 {
		settle(t, mID, aID, false)
	}
	// The statistics reach the shared counters when a backend goes idle, within a second.
	require.Eventually(t, func() bool { return hot() > before }, 10*time.Second, 100*time.Millisecond,
		"no reservation was closed by a HOT update")
	requireVerified(t)
}

// TestPaymentSettleIsHOT: no index of payments names a column that a payment's success changes,
// so processing -> succeeded is updated in place. The open payments are found through their
// idempotency records instead, whose index covers the open ones: starting the workflow (the
// reserve step) is a HOT update of the record and its completion is the one that is not.
func TestPaymentSettleIsHOT(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t) // its own statistics: no other test's updates
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 10_000})
	// updates waits for the table's update count to reach n (statistics reach the shared
	// counters when a backend goes idle, within a second) and returns how many were HOT.
	updates := func(table string, n int64) int64 {
		t.Helper()
		var upd, hot int64
		require.Eventually(t, func() bool {
			require.NoError(t, own.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = $1`,
				[]any{table}, &upd, &hot))
			return upd >= n
		}, 10*time.Second, 50*time.Millisecond, "%s: %d updates, want %d", table, upd, n)
		require.Equal(t, n, upd, "%s updates", table)
		return hot
	}
	const payments = 5
	var ids []uuid.UUID
	for i := range payments {
		key := fmt.Sprintf("hot-%d", i)
		req := payment.Request{InvoiceID: key, AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}
		_, p, began, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, Request: req, OperationID: payment.NewID(), Lease: time.Minute})
		require.NoError(t, err)
		require.Equal(t, store.BeganNew, began)
		require.NoError(t, own.Reserve(ctx, p.ID))
		ids = append(ids, p.ID)
	}
	recordsStartedHOT := updates("idempotency_records", payments)
	for _, id := range ids {
		_, err := own.Finalize(ctx, id, "ch_"+id.String())
		require.NoError(t, err)
	}
	require.Equal(t, int64(payments), updates("payments", payments), "every payment's settle is a HOT update")
	require.Equal(t, int64(payments), recordsStartedHOT, "starting the workflow is a HOT update of the record")
	require.Equal(t, int64(payments), updates("idempotency_records", 2*payments), "of the records' updates, only the completions are not HOT")
	problems, err := own.Verify(ctx)
	require.NoError(t, err)
	require.Empty(t, problems)
}

// The migration that keeps payments' status out of its indexes goes both ways: up, the
// business key keeps its name and guards the live payments by their failure code, and the
// status indexes make way for the open records' and the failed payments'; down, the indexes
// are exactly those before it.
func TestPaymentsHOTMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sqldb, err := sql.Open("pgx", env.OwnDatabase(t))
	require.NoError(t, err)
	defer sqldb.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqldb, os.DirFS("../schema/migrations"))
	require.NoError(t, err)
	indexes := func() map[string]string {
		t.Helper()
		rows, err := sqldb.QueryContext(ctx, `SELECT indexname, indexdef FROM pg_indexes
			WHERE tablename IN ('payments', 'idempotency_records')`)
		require.NoError(t, err)
		defer rows.Close()
		out := map[string]string{}
		for rows.Next() {
			var name, def string
			require.NoError(t, rows.Scan(&name, &def))
			out[name] = def
		}
		require.NoError(t, rows.Err())
		return out
	}
	_, err = p.UpTo(ctx, 13)
	require.NoError(t, err)
	before := indexes()
	_, err = p.UpTo(ctx, 14)
	require.NoError(t, err)
	after := indexes()
	for _, gone := range []string{"payments_merchant_status_created", "payments_unknown", "payments_processing", "idempotency_unstarted"} {
		require.Contains(t, before, gone)
		require.NotContains(t, after, gone)
	}
	require.Contains(t, after["payments_business_key"], "UNIQUE INDEX payments_business_key ON public.payments USING btree (merchant_id, invoice_id, payment_type) WHERE (failure_code IS NULL)")
	require.Contains(t, after["payments_merchant_failed"], "(merchant_id, created_at, id) WHERE (failure_code IS NOT NULL)")
	require.Contains(t, after["idempotency_open"], "(merchant_id, scope, created_at, operation_id) WHERE (status <> 'completed'::text)")
	for name, def := range after {
		if strings.Contains(def, " ON public.payments ") {
			for _, col := range []string{"status", "provider_reference", "updated_at", "charge_attempts", "refund"} {
				require.NotContains(t, def, col, "%s names a column a payment's success changes", name)
			}
		}
	}
	_, err = p.DownTo(ctx, 13)
	require.NoError(t, err)
	require.Equal(t, before, indexes())
}
