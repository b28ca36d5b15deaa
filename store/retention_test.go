package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// idAt is a UUIDv7 minted at t: what payment.NewID gave a request that arrived then.
func idAt(t time.Time) uuid.UUID {
	id := payment.NewID()
	ms := uint64(t.UnixMilli())
	for i := 0; i < 6; i++ {
		id[i] = byte(ms >> (40 - 8*i))
	}
	return id
}

// putRecord writes an idempotency record that arrived at created and last changed at updated.
func putRecord(t *testing.T, merchantID uuid.UUID, scope store.Scope, key, status string, created, updated time.Time) uuid.UUID {
	t.Helper()
	id := idAt(created)
	outcome, body := any(nil), any(nil)
	if status == "completed" {
		outcome, body = "succeeded", []byte(`{"status":"succeeded"}`)
	}
	require.NoError(t, db.Exec(context.Background(), `INSERT INTO idempotency_records (merchant_id, scope, idempotency_key,
		request_hash, status, operation_id, outcome, response_body, workflow_started, created_at, updated_at)
		VALUES ($1, $2, $3, repeat('0', 64), $4, $5, $6, $7, true, $8, $9)`,
		merchantID, string(scope), key, status, id, outcome, body, created, updated))
	return id
}

func recordExists(t *testing.T, id uuid.UUID) bool {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_records WHERE operation_id = $1`, []any{id}, &n))
	return n == 1
}

func TestDeleteExpiredRecordsKeepsYoungAndOpenOnes(t *testing.T) {
	// Not parallel: the other tests' passes delete expired records of every merchant, and would
	// take some of these before this pass counts them.
	mID, _ := fixture(t, 0)
	now := time.Now()
	cases := []struct {
		name             string
		scope            store.Scope
		status           string
		created, updated time.Duration // ago
		gone             bool
	}{
		{"completed 2h ago", store.ScopePayment, "completed", 2 * time.Hour, 2 * time.Hour, true},
		{"refund completed 2h ago", store.ScopeRefund, "completed", 2 * time.Hour, 2 * time.Hour, true},
		{"completed 1h1m ago", store.ScopePayment, "completed", 62 * time.Minute, 61 * time.Minute, true},
		{"completed 59m ago", store.ScopePayment, "completed", 59 * time.Minute, 59 * time.Minute, false},
		{"begun 3h ago, completed 10m ago", store.ScopePayment, "completed", 3 * time.Hour, 10 * time.Minute, false},
		{"processing for 2h", store.ScopePayment, "processing", 2 * time.Hour, 2 * time.Hour, false},
		{"unknown for 2h", store.ScopePayment, "unknown", 2 * time.Hour, 2 * time.Hour, false},
		{"refund unknown for 2h", store.ScopeRefund, "unknown", 2 * time.Hour, 2 * time.Hour, false},
	}
	ids := make([]uuid.UUID, len(cases))
	for i, c := range cases {
		ids[i] = putRecord(t, mID, c.scope, fmt.Sprintf("k%d", i), c.status, now.Add(-c.created), now.Add(-c.updated))
	}
	// Batches of one: the run goes on until a batch comes back short.
	n, err := db.DeleteExpiredRecords(context.Background(), time.Hour, 1)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, int64(3))
	for i, c := range cases {
		require.Equal(t, c.gone, !recordExists(t, ids[i]), c.name)
	}
}

// A manual payment's create is answered at its authorization, but the payment stays open until
// its capture, cancel or expiry (up to KASA_CAPTURE_WINDOW, longer than the retention): its record
// is kept until then, so that its key still names it.
func TestDeleteExpiredRecordsKeepsWaitingAuthorizations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	p := authorizedAs(t, mID, aID, "old-auth", 1_000, idAt(time.Now().Add(-3*time.Hour)))
	age := func() {
		require.NoError(t, db.Exec(ctx, `UPDATE idempotency_records SET updated_at = now() - interval '2 hours' WHERE operation_id = $1`, p.ID))
	}
	age()
	_, err := db.DeleteExpiredRecords(ctx, time.Hour, 100)
	require.NoError(t, err)
	require.True(t, recordExists(t, p.ID), "the authorization still waits for its capture")

	_, err = db.Captured(ctx, p.ID, 1_000, "au_1", uuid.Nil)
	require.NoError(t, err)
	age()
	_, err = db.DeleteExpiredRecords(ctx, time.Hour, 100)
	require.NoError(t, err)
	require.False(t, recordExists(t, p.ID), "captured: the record expires as any other")
}

// Workers delete side by side: every expired record goes, once, and no runner fails.
// Not parallel: another test's retention run would delete some of these records and the count
// would fall short.
func TestDeleteExpiredRecordsConcurrently(t *testing.T) {
	mID, _ := fixture(t, 0)
	old := time.Now().Add(-3 * time.Hour)
	const records = 400
	for i := range records {
		putRecord(t, mID, store.ScopePayment, fmt.Sprintf("c%d", i), "completed", old.Add(time.Duration(i)*time.Millisecond), old.Add(time.Second))
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
		errs  []error
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := db.DeleteExpiredRecords(context.Background(), 2*time.Hour, 7)
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	// A runner skips what another holds, and the holder deletes it: nothing is left over.
	var left int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_records WHERE merchant_id = $1`, []any{mID}, &left))
	require.Zero(t, left)
	require.GreaterOrEqual(t, total, int64(records))
}

// A request whose key's record is deleted by retention while Begin runs: Begin's read still
// sees the old record, but its insert, which waited for the delete, makes the new one. The
// request owns what it wrote (BeganNew), never answered with the old outcome while a new
// payment waits for the sweeper to charge it.
func TestBeginRacingRetentionOwnsWhatItWrote(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, aID := fixture(t, 10_000)
	putRecord(t, mID, store.ScopePayment, "race", "completed", time.Now().Add(-2*time.Hour), time.Now().Add(-2*time.Hour))
	commit, err := db.Uncommitted(ctx, `DELETE FROM idempotency_records WHERE merchant_id = $1 AND scope = 'payment' AND idempotency_key = 'race'`, mID)
	require.NoError(t, err)

	type result struct {
		rec   store.Record
		p     payment.Payment
		began store.Began
		err   error
	}
	done := make(chan result, 1)
	op := payment.NewID()
	go func() {
		req := payment.Request{InvoiceID: "inv-race", AmountMinor: 100, Currency: "TRY", AccountID: aID, PaymentType: "purchase"}
		rec, p, began, err := db.Begin(ctx, store.BeginInput{MerchantID: mID, Key: "race", Request: req, OperationID: op, Lease: time.Minute})
		done <- result{rec, p, began, err}
	}()
	// Begin's read has seen the old record once its insert waits on the deleted row's lock.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%idempotency_records%'`, nil, &n))
		return n > 0
	}, 10*time.Second, 10*time.Millisecond, "Begin never waited for the delete")
	require.NoError(t, commit())
	r := <-done
	require.NoError(t, r.err)

	var owner uuid.UUID
	require.NoError(t, db.QueryRow(ctx, `SELECT operation_id FROM idempotency_records WHERE merchant_id = $1 AND idempotency_key = 'race'`,
		[]any{mID}, &owner))
	require.Equal(t, op, owner, "the key's record is the new request's")
	require.Equal(t, store.BeganNew, r.began, "the new request owns the record and the payment it wrote")
	require.Equal(t, op, r.p.ID)
	require.Equal(t, op, r.rec.OperationID)
}

// The shortest retention a live deleter announced bounds the APIs' replay caches, which read the
// database's clock with it; one not announced within live no longer counts. Deleting announces the retention it deletes by.
// (Durations below any other test's, which may announce theirs meanwhile.)
func TestShortestRetention(t *testing.T) {
	ctx := context.Background()
	require.NoError(t, db.SeeRetention(ctx, 3*time.Millisecond))
	require.NoError(t, db.SeeRetention(ctx, 2*time.Millisecond))
	before := time.Now()
	got, at, err := db.ShortestRetention(ctx, time.Minute)
	require.NoError(t, err)
	require.Equal(t, 2*time.Millisecond, got)
	var clock time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT now()`, nil, &clock))
	require.False(t, at.Before(before.Add(-time.Second)) || at.After(clock), "the database's clock as it read it: %s, between %s and %s", at, before, clock)
	require.NoError(t, db.Exec(ctx, `UPDATE record_retentions SET last_seen = now() - interval '2 minutes' WHERE retention_ms < 5`))
	got, _, err = db.ShortestRetention(ctx, time.Minute)
	require.NoError(t, err)
	require.True(t, got == 0 || got > 3*time.Millisecond, "a deleter gone for longer than live no longer counts: %s", got)
	require.NoError(t, db.Exec(ctx, `DELETE FROM record_retentions WHERE retention_ms < 5`))
	const long = 1000 * time.Hour // deletes nothing here
	_, err = db.DeleteExpiredRecords(ctx, long, 1000)
	require.NoError(t, err)
	var fresh bool
	require.NoError(t, db.QueryRow(ctx, `SELECT last_seen > now() - interval '1 minute' FROM record_retentions WHERE retention_ms = $1`,
		[]any{long.Milliseconds()}, &fresh))
	require.True(t, fresh, "a deletion announces its retention")
}
