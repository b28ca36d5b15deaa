package store_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
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

// A drainer that takes the lead counts, among the payments it keeps started, those a drainer
// claimed and started that still process; not one still queued (the last leader's claim, or put
// back), one left to the sweeper, one flagged stuck, one finished, or one an API started itself.
func TestDrainedProcessingIsTheDrainersStartedPaymentsStillProcessing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own := ownStore(t)
	started := func(id uuid.UUID) error { return own.WorkflowStarted(ctx, id) }
	for _, tc := range []struct {
		name   string
		queued bool                     // queued by the API, and claimed by a drainer
		then   func(id uuid.UUID) error // after the claim
		counts bool
	}{
		{"started by the drainer, processing", true, started, true},
		{"claimed, not started yet", true, func(uuid.UUID) error { return nil }, false},
		{"put back in its queue", true, func(id uuid.UUID) error { return own.Unclaim(ctx, []uuid.UUID{id}) }, false},
		{"left to the sweeper, which started it", true, func(id uuid.UUID) error {
			if err := own.Unqueue(ctx, []uuid.UUID{id}); err != nil {
				return err
			}
			return started(id)
		}, false},
		{"flagged stuck", true, func(id uuid.UUID) error {
			if err := started(id); err != nil {
				return err
			}
			return own.FlagStuck(ctx, id, "test")
		}, false},
		{"finished", true, func(id uuid.UUID) error {
			if err := started(id); err != nil {
				return err
			}
			_, err := own.Release(ctx, id, "declined")
			return err
		}, false},
		{"started by its API", false, started, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := testkit.NewMerchant(t, own, testkit.MerchantOptions{Deposit: 100_000})
			key := uuid.NewString()
			_, p, _, err := own.Begin(ctx, store.BeginInput{MerchantID: m.ID, Key: key, Queue: tc.queued, OperationID: payment.NewID(), Lease: time.Minute,
				Request: payment.Request{InvoiceID: key, AmountMinor: 100, Currency: "TRY", AccountID: m.Account, PaymentType: "purchase"}})
			require.NoError(t, err)
			if tc.queued {
				// The earlier cases' queued ones may be claimed again beside it: their reads are done.
				queues, err := own.ClaimQueued(ctx, uuid.Nil, 10, 1, time.Minute)
				require.NoError(t, err)
				require.Contains(t, queues, []payment.Payment{p})
			}
			require.NoError(t, tc.then(p.ID))
			ps, err := own.DrainedProcessing(ctx)
			require.NoError(t, err)
			var ids []uuid.UUID
			for _, q := range ps {
				ids = append(ids, q.ID)
			}
			require.Equal(t, tc.counts, slices.Contains(ids, p.ID))
			if tc.counts {
				_, err := own.Release(ctx, p.ID, "declined") // the next case's read counts only its own
				require.NoError(t, err)
			}
		})
	}
}

// A drainer's read when it takes the lead goes through the open records, never the whole table of
// finished ones: it happens during a payday, with millions of records kept for their retention.
func TestDrainedProcessingReadsTheOpenRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	own, url := ownStoreAt(t)
	m := testkit.NewMerchant(t, own, testkit.MerchantOptions{})
	require.NoError(t, own.Exec(ctx, `INSERT INTO idempotency_records
		(merchant_id, scope, idempotency_key, request_hash, status, operation_id, workflow_started, drained)
		SELECT $1, 'payment', 'done-' || g, repeat('0', 64), 'completed', gen_random_uuid(), true, g % 2 = 0
		FROM generate_series(1, 20000) g`, m.ID))
	require.NoError(t, own.Exec(ctx, `ANALYZE idempotency_records`))
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var raw []byte
	require.NoError(t, conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+dbsqlc.DrainedProcessing).Scan(&raw))
	var out []struct {
		Plan analyzedNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &out))
	out[0].Plan.walk(func(n analyzedNode) {
		if n.RelationName == "idempotency_records" {
			require.NotEqual(t, "Seq Scan", n.NodeType, "plan %s", raw)
		}
	})
}
