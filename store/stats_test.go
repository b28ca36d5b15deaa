package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// The db_lock_wait and hot_account_rate figures see a blocked row update and fresh postings.
func TestStatsSeeLockWaitsAndHotAccounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	settle(t, mID, aID, false)

	st, err := db.Stats(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, st.HotAccountPostings, int64(1), "this minute's postings")
	require.Greater(t, st.HotAccountShare, 0.0)
	require.LessOrEqual(t, st.HotAccountShare, 1.0)

	release, err := db.HoldRowLock(ctx, aID)
	require.NoError(t, err)
	blocked := make(chan error, 1)
	go func() { blocked <- db.Exec(ctx, `UPDATE accounts SET updated_at = now() WHERE id = $1`, aID) }()
	require.Eventually(t, func() bool {
		st, err := db.Stats(ctx)
		return err == nil && st.LockWaits["transactionid"] >= 1
	}, 10*time.Second, 20*time.Millisecond, "the blocked UPDATE waits on the holder's transaction")
	release()
	require.NoError(t, <-blocked)
}

func TestBeginChargeAttemptCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	_, p, _, err := begin(t, mID, aID, "attempts", "inv-attempts", 100)
	require.NoError(t, err)
	for want := 1; want <= 3; want++ {
		n, err := db.BeginChargeAttempt(ctx, p.ID)
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	_, err = db.BeginChargeAttempt(ctx, payment.NewID())
	require.ErrorIs(t, err, payment.ErrNotFound)
}

// An unknown refund is money at risk as an unknown payment is: it is counted, and its age is
// the reconciliation's age when it is the oldest.
func TestStatsCountUnknownRefunds(t *testing.T) {
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	pid := settle(t, mID, aID, false)
	before, err := db.Stats(ctx)
	require.NoError(t, err)

	_, r, _, err := beginRefund(t, mID, pid, "stats-unknown", `{"amount":"0.10"}`)
	require.NoError(t, err)
	require.NoError(t, db.HoldRefund(ctx, r.ID))
	_, err = db.MarkRefundUnknown(ctx, r.ID)
	require.NoError(t, err)

	after, err := db.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, before.UnknownRefunds+1, after.UnknownRefunds)
	require.Equal(t, before.UnknownCount, after.UnknownCount, "payments are counted apart")
	require.False(t, after.OldestUnknown.IsZero())
	require.Equal(t, before.StuckRefunds, after.StuckRefunds)
	require.NoError(t, db.FlagRefundStuck(ctx, r.ID, "test"))
	after, err = db.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, before.StuckRefunds+1, after.StuckRefunds)
}

// The unknown payments and the stuck ones are counted exactly, read through the open records:
// a payment flagged stuck counts whatever its status, a processing one once it is older than
// StuckAfter, and both at once count once.
func TestStatsCountOpenPayments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{})
	now := time.Now().UTC().Truncate(time.Microsecond)
	old := now.Add(-store.StuckAfter - time.Hour)
	seedPayment(t, own, m, old, payment.StatusSucceeded)
	seedPayment(t, own, m, old, payment.StatusFailed)
	seedPayment(t, own, m, now, payment.StatusProcessing)
	seedPayment(t, own, m, now.Add(-store.StuckAfter+time.Minute), payment.StatusProcessing)
	seedPayment(t, own, m, old, payment.StatusProcessing)
	require.NoError(t, own.FlagStuck(ctx, seedPayment(t, own, m, old, payment.StatusProcessing), "test"))
	require.NoError(t, own.FlagStuck(ctx, seedPayment(t, own, m, now, payment.StatusSucceeded), "test"))
	oldest := now.Add(-3 * time.Hour)
	seedPayment(t, own, m, oldest, payment.StatusUnknown)
	seedPayment(t, own, m, now.Add(-time.Hour), payment.StatusUnknown)

	st, err := own.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), st.UnknownCount)
	require.True(t, oldest.Equal(st.OldestUnknown), "oldest unknown %v, want %v", st.OldestUnknown, oldest)
	require.Equal(t, int64(3), st.Stuck, "two old processing payments (one flagged too) and a flagged succeeded one")
}
