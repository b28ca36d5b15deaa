package store_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// count is a count(*) query's answer.
func count(t *testing.T, st *store.Store, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, st.QueryRow(context.Background(), query, args, &n))
	return n
}

// Concurrent creations with one key: the key's unique constraint lets one create, and every
// other answers what it created; a replay with another currency is refused, another merchant's
// same key creates its own; a creation for no merchant leaves the key free.
func TestCreateAccountOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mID, _ := fixture(t, 0)
	other, _ := fixture(t, 0)
	key := "acct-" + uuid.NewString()

	_, _, err := db.CreateAccountOnce(ctx, key, payment.NewID(), "TRY")
	require.ErrorIs(t, err, payment.ErrNotFound)

	var wg sync.WaitGroup
	var mu sync.Mutex
	ids, created := map[uuid.UUID]bool{}, 0
	for range 16 {
		wg.Go(func() {
			a, replayed, err := db.CreateAccountOnce(ctx, key, mID, "USD")
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			ids[a.ID] = true
			if !replayed {
				created++
			}
		})
	}
	wg.Wait()
	require.Len(t, ids, 1)
	require.Equal(t, 1, created)
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM accounts WHERE merchant_id = $1 AND currency = 'USD' AND kind = 'customer'`, mID))
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM accounts WHERE merchant_id = $1 AND currency = 'USD' AND kind = 'settlement'`, mID))

	accounts := count(t, db, `SELECT count(*) FROM accounts WHERE merchant_id = $1`, mID)
	_, _, err = db.CreateAccountOnce(ctx, key, mID, "TRY")
	require.ErrorIs(t, err, payment.ErrIdempotencyReused)
	require.Equal(t, accounts, count(t, db, `SELECT count(*) FROM accounts WHERE merchant_id = $1`, mID), "nothing opened")
	// The key is the merchant's own: another merchant's same key is another creation.
	a, replayed, err := db.CreateAccountOnce(ctx, key, other, "USD")
	require.NoError(t, err)
	require.False(t, replayed)
	require.False(t, ids[a.ID])
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM accounts WHERE merchant_id = $1 AND currency = 'USD' AND kind = 'customer'`, other))
}

// The same for merchants: one merchant with one API key, every request answering its secrets;
// another request hash is refused.
func TestCreateMerchantOnceUnderConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key, hash := "merchant-"+uuid.NewString(), []byte("hash-1")
	var wg sync.WaitGroup
	var mu sync.Mutex
	answers, created := map[store.MerchantCreated]bool{}, 0
	for range 16 {
		wg.Go(func() {
			c := store.MerchantCreated{APIKeyID: payment.NewID(), APIKey: payment.NewSecret("sk_"), WebhookSecret: payment.NewSecret("whsec_")}
			first, replayed, err := db.CreateMerchantOnce(ctx, key, hash, payment.Merchant{ID: payment.NewID(), Name: key}, c)
			require.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			answers[first] = true
			if !replayed {
				created++
			}
		})
	}
	wg.Wait()
	require.Len(t, answers, 1)
	require.Equal(t, 1, created)
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM merchants WHERE name = $1`, key))
	for first := range answers {
		m, err := db.MerchantByAPIKey(ctx, first.APIKey)
		require.NoError(t, err)
		require.Equal(t, first.MerchantID, m.ID)
		require.Equal(t, 1, count(t, db, `SELECT count(*) FROM api_keys WHERE merchant_id = $1 AND id = $2`, m.ID, first.APIKeyID))
	}
	_, _, err := db.CreateMerchantOnce(ctx, key, []byte("hash-2"), payment.Merchant{ID: payment.NewID(), Name: key},
		store.MerchantCreated{APIKeyID: payment.NewID(), APIKey: "sk_x", WebhookSecret: "whsec_x"})
	require.ErrorIs(t, err, payment.ErrIdempotencyReused)
	require.Equal(t, 1, count(t, db, `SELECT count(*) FROM merchants WHERE name = $1`, key))
}

// A merchant creation's answer is kept sealed: a master key rotation re-seals it, so a replay
// under the new key alone answers the same secrets; retention wipes it, and a replay then
// names the merchant and creates nothing.
func TestMerchantCreationAnswerSealedRotatedAndForgotten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	oldKey, newKey := testkit.SecretKey, bytes.Repeat([]byte{9}, 32)
	open := opener(t, url)
	old := open(oldKey, nil)
	require.NoError(t, old.CheckSecretKey(ctx))
	m := payment.Merchant{ID: payment.NewID(), Name: "Sealed"}
	c := store.MerchantCreated{APIKeyID: payment.NewID(), APIKey: payment.NewSecret("sk_"), WebhookSecret: payment.NewSecret("whsec_")}
	_, replayed, err := old.CreateMerchantOnce(ctx, "k", []byte("h"), m, c)
	require.NoError(t, err)
	require.False(t, replayed)
	require.Zero(t, count(t, old, `SELECT count(*) FROM merchant_creations WHERE position(convert_to($1, 'UTF8') IN answer_enc) > 0
		OR position(convert_to($2, 'UTF8') IN answer_enc) > 0`, c.APIKey, c.WebhookSecret), "never in clear")

	_, err = open(newKey, oldKey).RotateSecretKey(ctx)
	require.NoError(t, err)
	alone := open(newKey, nil)
	first, replayed, err := alone.CreateMerchantOnce(ctx, "k", []byte("h"), payment.Merchant{ID: payment.NewID(), Name: "Sealed"},
		store.MerchantCreated{APIKeyID: payment.NewID(), APIKey: "sk_other", WebhookSecret: "whsec_other"})
	require.NoError(t, err)
	require.True(t, replayed)
	c.MerchantID = m.ID
	require.Equal(t, c, first, "re-sealed under the new key")

	_, err = alone.DeleteExpiredRecords(ctx, time.Hour, 100)
	require.NoError(t, err)
	require.Equal(t, 1, count(t, alone, `SELECT count(*) FROM merchant_creations WHERE answer_enc IS NOT NULL`), "kept within the retention")
	require.NoError(t, alone.Exec(ctx, `UPDATE merchant_creations SET created_at = now() - interval '2 hours'`))
	_, err = alone.DeleteExpiredRecords(ctx, time.Hour, 100)
	require.NoError(t, err)
	require.Equal(t, 1, count(t, alone, `SELECT count(*) FROM merchant_creations WHERE answer_enc IS NULL`))
	_, _, err = alone.CreateMerchantOnce(ctx, "k", []byte("h"), payment.Merchant{ID: payment.NewID(), Name: "Sealed"},
		store.MerchantCreated{APIKeyID: payment.NewID(), APIKey: "sk_late", WebhookSecret: "whsec_late"})
	var expired *payment.AnswerExpiredError
	require.ErrorAs(t, err, &expired)
	require.Equal(t, m.ID.String(), expired.MerchantID)
	require.Equal(t, 1, count(t, alone, `SELECT count(*) FROM merchants`))
}

// Mid-rotation (the first step: some processes on the new key with the old as previous, some
// still on the old key alone) a merchant creation's answer is sealed under the deployment's key,
// so an API not yet restarted replays it too. A rotation that commits while a creation waits to
// write its merchant retires that key without seeing the answer: the creation then seals it
// again under the new key, which alone opens it once the old key is gone.
func TestMerchantCreationAnswerMidRotation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	oldKey, newKey := testkit.SecretKey, bytes.Repeat([]byte{5}, 32)
	open := opener(t, url)
	old := open(oldKey, nil)
	require.NoError(t, old.CheckSecretKey(ctx))
	both := open(newKey, oldKey)
	create := func(st *store.Store, key string) store.MerchantCreated {
		t.Helper()
		c := store.MerchantCreated{APIKeyID: payment.NewID(), APIKey: payment.NewSecret("sk_"), WebhookSecret: payment.NewSecret("whsec_")}
		got, replayed, err := st.CreateMerchantOnce(ctx, key, []byte("h"), payment.Merchant{ID: payment.NewID(), Name: key}, c)
		require.NoError(t, err)
		require.False(t, replayed)
		return got
	}
	replay := func(st *store.Store, key string) store.MerchantCreated {
		t.Helper()
		got, replayed, err := st.CreateMerchantOnce(ctx, key, []byte("h"), payment.Merchant{ID: payment.NewID(), Name: key},
			store.MerchantCreated{APIKeyID: payment.NewID(), APIKey: "sk_other", WebhookSecret: "whsec_other"})
		require.NoError(t, err, key)
		require.True(t, replayed, key)
		return got
	}
	first := create(both, "made-on-the-new-key")
	require.Equal(t, first, replay(old, "made-on-the-new-key"), "replayed by a process on the old key alone")
	require.Equal(t, first, replay(both, "made-on-the-new-key"))

	// A rotation takes the merchants' lock first; the creation, which read the deployment's key
	// and sealed its answer, waits behind it to write its merchant.
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	holder, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `LOCK TABLE merchants IN SHARE ROW EXCLUSIVE MODE`)
	require.NoError(t, err)
	waiting := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			return count(t, old, `SELECT count(*) FROM pg_locks WHERE database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND relation = 'merchants'::regclass AND NOT granted`) == n
		}, 10*time.Second, 10*time.Millisecond)
	}
	rotated := make(chan error, 1)
	go func() { _, err := open(newKey, oldKey).RotateSecretKey(ctx); rotated <- err }()
	waiting(1)
	racing := make(chan store.MerchantCreated, 1)
	go func() { racing <- create(both, "made-as-the-rotation-commits") }()
	waiting(2)
	require.NoError(t, holder.Rollback(ctx))
	require.NoError(t, <-rotated)
	raced := <-racing

	alone := open(newKey, nil)
	require.Equal(t, first, replay(alone, "made-on-the-new-key"), "re-sealed by the rotation")
	require.Equal(t, raced, replay(alone, "made-as-the-rotation-commits"), "sealed under the new key")
	require.Equal(t, 0, count(t, alone, `SELECT count(*) FROM merchants m JOIN merchant_creations c ON c.merchant_id = m.id
		WHERE c.idempotency_key = 'made-as-the-rotation-commits' AND m.name <> c.idempotency_key`))
}
