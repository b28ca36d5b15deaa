package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// Concurrent refunds never exceed the payment, enforced in the database by a conditional
// update and a CHECK (docs/api.md, refunds). The conditional update alone must refuse a hold above what
// is left once the in-flight holds are counted: no row, not a CHECK violation.
func TestHoldPaymentRefundCountsInFlightHolds(t *testing.T) {
	// Not parallel: the holds below have no refund rows, which Verify (run by parallel tests
	// over the whole database) would report; they are undone before any parallel test runs.
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	pay := paid(t, mID, aID, 10_000)
	t.Cleanup(func() { _ = db.Exec(ctx, `UPDATE payments SET refund_held_minor = 0 WHERE id = $1`, pay) })
	var held int64
	require.NoError(t, db.QueryRow(ctx, dbsqlc.HoldPaymentRefund, []any{int64(9_000), pay}, &held))
	require.Equal(t, int64(9_000), held)
	err := db.QueryRow(ctx, dbsqlc.HoldPaymentRefund, []any{int64(1_001), pay}, &held)
	require.ErrorIs(t, err, pgx.ErrNoRows, "refused by the update's own condition")
	require.NoError(t, db.QueryRow(ctx, dbsqlc.HoldPaymentRefund, []any{int64(1_000), pay}, &held))
	require.Equal(t, int64(10_000), held)
}

// The run that failed a refund for insufficient funds, executing its first step again (its
// worker died before its workflow task completed), is answered insufficient funds again, as a
// payment's is: not an inconsistency that flags the refund stuck.
func TestRefundHoldRunAgainAfterInsufficientFunds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 100_000)
	pay := paid(t, mID, aID, 10_000)
	settlement := settlementAccount(t, mID)
	payout(t, settlement.ID, aID, 8000)
	_, r, _, err := beginRefund(t, mID, pay, "again-k", `{"amount":"30.00"}`)
	require.NoError(t, err)
	require.ErrorIs(t, db.HoldRefundRun(ctx, r.ID, "run-1"), payment.ErrInsufficientFunds)
	_, err = db.ReleaseRefund(ctx, r.ID, payment.FailureInsufficientFunds)
	require.NoError(t, err)
	require.ErrorIs(t, db.HoldRefundRun(ctx, r.ID, "run-1"), payment.ErrInsufficientFunds, "the deciding run's first step, executed again")
	var decided *payment.DecidedError
	require.ErrorAs(t, db.HoldRefundRun(ctx, r.ID, "run-2"), &decided, "another run")
}
