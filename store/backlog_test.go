package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// The drainer's record says what the backlog held when it saved it, every second. One older
// than that (the drainer stuck starting a workflow while Temporal is away, or none leads) is not
// what the APIs bound new payments by: the backlog is counted from the queue itself.
func TestBacklogStateCountsTheQueueWhenTheRecordIsStale(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 100_000})
	require.NoError(t, own.SaveBacklogState(ctx, store.BacklogState{Queued: 1, DrainPerSecond: 5}))
	for range 3 {
		key := uuid.NewString()
		_, _, _, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, Queue: true, OperationID: payment.NewID(), Lease: time.Minute,
			Request: payment.Request{InvoiceID: key, AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}})
		require.NoError(t, err)
	}
	st, err := own.BacklogState(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Queued, "a fresh record is taken as the drainer saved it")
	require.False(t, st.Counted)

	require.NoError(t, own.Exec(ctx, `UPDATE backlog_state SET updated_at = now() - interval '5 seconds'`))
	st, err = own.BacklogState(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), st.Queued, "a stale record: the queue counted")
	require.True(t, st.Counted)
	require.Equal(t, 5.0, st.DrainPerSecond, "the rate is still the record's (the API reads its age)")
}

// A leader that stops checking its lead (its process frozen, its host cut off) loses it: the
// session that holds the lock is ended by PostgreSQL once idle for leadIdle, and another process
// takes the lead; the old leader then finds it lost.
func TestFrozenLeaderLosesTheLead(t *testing.T) {
	ctx := context.Background()
	own := ownStore(t)
	defer store.SetLeadIdle(time.Second)()

	ok, held, release, err := own.Lead(ctx, "frozen")
	require.NoError(t, err)
	require.True(t, ok)
	defer release()
	again, _, _, err := own.Lead(ctx, "frozen")
	require.NoError(t, err)
	require.False(t, again, "held while its leader checks it")
	time.Sleep(200 * time.Millisecond)
	require.True(t, held(ctx))

	var other bool
	require.Eventually(t, func() bool {
		var release func()
		other, _, release, err = own.Lead(ctx, "frozen")
		if other {
			release()
		}
		return err == nil && other
	}, 10*time.Second, 200*time.Millisecond, "the frozen leader's lock is let go")
	require.False(t, held(ctx), "the frozen leader finds it lost the lead")
}

// A lead given up returns its connection to the pool without the leader's idle timeout: a pooled
// connection of the application's is not ended by PostgreSQL for being idle.
func TestReleasedLeadLeavesNoIdleTimeout(t *testing.T) {
	ctx := context.Background()
	own, err := store.Open(ctx, store.Options{URL: env.OwnDatabase(t), SecretKey: testkit.SecretKey, Migrate: true, MaxConns: 1})
	require.NoError(t, err)
	defer own.Close()
	ok, _, release, err := own.Lead(ctx, "released")
	require.NoError(t, err)
	require.True(t, ok)
	release()
	var v string
	require.NoError(t, own.QueryRow(ctx, `SHOW idle_session_timeout`, nil, &v))
	require.Equal(t, "0", v, "the pool's connection kept the leader's session setting")
}
