package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// waitLocked waits until a backend runs a statement containing frag and waits for a lock.
func waitLocked(t *testing.T, conn *pgx.Conn, frag string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		require.NoError(t, conn.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, frag).Scan(&n))
		if n > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no backend waits for a lock in %q", frag)
}

// A stale attempt of a payment's Reserve (a worker that died with its statement blocked on the
// payer's row, a timed-out local activity) and the Release of another attempt's insufficient
// funds take turns on the payment: whichever comes second sees the other's work, and a failed
// payment keeps no hold.
func TestStaleReserveHoldsNothingForAFailedPayment(t *testing.T) {
	ctx := context.Background()
	st, url := ownStoreAt(t)
	var err error
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 10_000})
	q := verifyBegin(t, st, m, 10_000, false)
	require.NoError(t, st.Reserve(ctx, q.ID)) // another payment holds everything
	p := verifyBegin(t, st, m, 10_000, false)
	require.ErrorIs(t, st.Reserve(ctx, p.ID), payment.ErrInsufficientFunds) // attempt 2

	// q is let go; then some writer of the payer's row (another payment's step, a deposit) holds it.
	_, err = st.Release(ctx, q.ID, payment.FailureDeclined)
	require.NoError(t, err)
	x, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer x.Close(ctx)
	tx, err := x.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE accounts SET updated_at = now() WHERE id = $1`, m.Account)
	require.NoError(t, err)

	// attempt 1 (stale): blocked on the payer's row.
	done := make(chan error, 1)
	go func() { done <- st.Reserve(ctx, p.ID) }()
	mon, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer mon.Close(ctx)
	waitLocked(t, mon, "balance_reservations")

	// The workflow fails p on attempt 2's answer (it may wait for attempt 1 to end).
	released := make(chan error, 1)
	go func() { _, err := st.Release(ctx, p.ID, payment.FailureInsufficientFunds); released <- err }()
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-done)
	require.NoError(t, <-released)

	got, err := st.Payment(ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, got.Status)
	a, err := st.Account(ctx, m.Account)
	require.NoError(t, err)
	problems := problemsOf(t, st)
	t.Logf("reserved %d; verify: %v", a.Reserved, problems)
	require.Zero(t, a.Reserved, "a failed payment holds nothing")
	require.Empty(t, problems)
}

// The refund's hold takes turns with its release the same way: a stale attempt waiting for the
// settlement account's shards (a payment's credit coming in) holds nothing for a refund another
// attempt's insufficient funds failed meanwhile.
func TestStaleRefundHoldHoldsNothingForAFailedRefund(t *testing.T) {
	ctx := context.Background()
	st, url := ownStoreAt(t)
	var err error
	m := testkit.NewMerchant(t, st, testkit.MerchantOptions{Deposit: 100_000})
	p := verifyBegin(t, st, m, 10_000, false)
	require.NoError(t, st.Reserve(ctx, p.ID))
	_, err = st.Finalize(ctx, p.ID, "ch")
	require.NoError(t, err)
	var settlement [16]byte
	require.NoError(t, st.QueryRow(ctx, `SELECT id FROM accounts WHERE merchant_id = $1 AND kind = 'settlement'`, []any{m.ID}, &settlement))
	sid := settlement
	// pay most of it out (balanced, to the payer): 2,000 left
	move := func(q interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, amount int64) {
		_, err := q.Exec(ctx, `WITH p AS (INSERT INTO ledger_postings (id, kind, reference) VALUES (gen_random_uuid(), 'reversal', 'x-' || gen_random_uuid()) RETURNING id),
e AS (INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
      SELECT gen_random_uuid(), p.id, x.acc, 'TRY', x.amt FROM p, (VALUES ($1::uuid, -$3::bigint), ($2::uuid, $3::bigint)) x(acc, amt)),
c AS (UPDATE accounts SET balance = balance + $3 WHERE id = $2)
UPDATE settlement_shards SET balance = balance - $3 WHERE account_id = $1 AND shard = (SELECT shard FROM settlement_shards WHERE account_id = $1 LIMIT 1)`,
			sid, m.Account, amount)
		require.NoError(t, err)
	}
	c0, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer c0.Close(ctx)
	move(c0, 8_000)
	require.Empty(t, problemsOf(t, st))

	req, err := payment.ParseRefundRequest([]byte(`{"amount":"30.00"}`))
	require.NoError(t, err)
	_, r, _, err := st.BeginRefund(ctx, store.BeginRefundInput{MerchantID: m.ID, PaymentID: p.ID, Key: "rk", Request: req,
		OperationID: payment.NewID(), Lease: time.Minute})
	require.NoError(t, err)
	require.ErrorIs(t, st.HoldRefund(ctx, r.ID), payment.ErrInsufficientFunds) // attempt 2

	// X: a writer of the shards (a payment's credit coming in), in flight.
	x, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer x.Close(ctx)
	tx, err := x.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM settlement_shards WHERE account_id = $1 FOR UPDATE`, sid)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- st.HoldRefund(ctx, r.ID) }() // attempt 1, stale
	waitLocked(t, c0, "ORDER BY shard FOR UPDATE")

	released := make(chan error, 1)
	go func() { _, err := st.ReleaseRefund(ctx, r.ID, payment.FailureInsufficientFunds); released <- err }()
	time.Sleep(200 * time.Millisecond)
	move(tx, -5_000) // money in: 7,000 available
	require.NoError(t, tx.Commit(ctx))
	t.Logf("stale hold: %v", <-done)
	require.NoError(t, <-released)

	got, err := st.Refund(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, payment.StatusFailed, got.Status)
	a, err := st.Account(ctx, sid)
	require.NoError(t, err)
	problems := problemsOf(t, st)
	t.Logf("settlement reserved %d; verify: %v", a.Reserved, problems)
	require.Zero(t, a.Reserved, "a failed refund holds nothing")
	require.Empty(t, problems)
}
