package store_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// The first process records its key's check value; one with another key is refused, one with
// the same key is not.
func TestSecretKeyIsTheDeployments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	open := func(key []byte) *store.Store {
		st, err := store.Open(ctx, store.Options{URL: url, SecretKey: key, Migrate: true})
		require.NoError(t, err)
		t.Cleanup(st.Close)
		return st
	}
	require.NoError(t, open(testkit.SecretKey).CheckSecretKey(ctx))
	require.NoError(t, open(testkit.SecretKey).CheckSecretKey(ctx), "the same key again")
	other := bytes.Repeat([]byte{9}, 32)
	require.ErrorIs(t, open(other).CheckSecretKey(ctx), store.ErrSecretKeyMismatch)
}

// Processes starting at once on a new database all pass: one records its value, the others read it.
func TestSecretKeyRecordedByConcurrentStarts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	stores := make([]*store.Store, 8)
	for i := range stores {
		st, err := store.Open(ctx, store.Options{URL: url, SecretKey: testkit.SecretKey, Migrate: i == 0})
		require.NoError(t, err)
		t.Cleanup(st.Close)
		stores[i] = st
	}
	errs := make(chan error, len(stores))
	for _, st := range stores {
		go func() { errs <- st.CheckSecretKey(ctx) }()
	}
	for range stores {
		require.NoError(t, <-errs)
	}
}

// A master key rotation: processes with the new key and the old one as previous start beside
// the deployment's old key and open what it sealed; RotateSecretKey re-seals every webhook
// secret (and a rotation's previous one) under the new key and records it, after which the new
// key alone opens everything and the old key alone is refused. A secret neither key opens stops
// the rotation with nothing changed.
func TestRotateSecretKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	oldKey, newKey := testkit.SecretKey, bytes.Repeat([]byte{9}, 32)
	open := opener(t, url)
	secrets := func(st *store.Store) (string, string) {
		t.Helper()
		require.NoError(t, st.Exec(ctx, `UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1 second'`))
		ds, err := st.ClaimDeliveries(ctx, 10, 10, time.Millisecond)
		require.NoError(t, err)
		require.Len(t, ds, 1)
		return ds[0].Secret, ds[0].PreviousSecret
	}

	old := open(oldKey, nil)
	require.NoError(t, old.CheckSecretKey(ctx))
	m := testkit.NewMerchant(t, old, testkit.MerchantOptions{WebhookURL: "https://m.example/hooks", WebhookSecret: "whsec_one"})
	_, err := old.RotateWebhookSecret(ctx, m.ID, "whsec_two", time.Hour)
	require.NoError(t, err)
	require.NoError(t, old.Exec(ctx, `INSERT INTO webhook_deliveries (id, merchant_id, aggregate_id, event_type, event_created_at, url, body, status)
		VALUES ($1, $2, $3, 'payment.succeeded', now(), 'https://m.example/hooks', '{}', 'pending')`, payment.NewID(), m.ID, payment.NewID()))

	rotating := open(newKey, oldKey)
	require.NoError(t, rotating.CheckSecretKey(ctx), "the new key with the old one as previous joins the deployment")
	cur, prev := secrets(rotating)
	require.Equal(t, "whsec_two", cur)
	require.Equal(t, "whsec_one", prev)

	n, err := rotating.RotateSecretKey(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	alone := open(newKey, nil)
	require.NoError(t, alone.CheckSecretKey(ctx), "the new key is the deployment's")
	cur, prev = secrets(alone)
	require.Equal(t, "whsec_two", cur, "re-sealed under the new key")
	require.Equal(t, "whsec_one", prev)
	require.ErrorIs(t, old.CheckSecretKey(ctx), store.ErrSecretKeyRetired, "the old key alone is refused now")
	require.ErrorIs(t, open(oldKey, newKey).CheckSecretKey(ctx), store.ErrSecretKeyRetired, "and with the new one as its previous")
	_, err = old.RotateWebhookSecret(ctx, m.ID, "whsec_stale", time.Hour)
	require.ErrorIs(t, err, store.ErrSecretKeyRetired, "a process still running on the old key seals nothing more")
	cur, _ = secrets(alone)
	require.Equal(t, "whsec_two", cur)

	// Under a third key, with a previous key that opens nothing here, nothing is re-sealed.
	third := open(bytes.Repeat([]byte{3}, 32), bytes.Repeat([]byte{4}, 32))
	_, err = third.RotateSecretKey(ctx)
	require.ErrorIs(t, err, store.ErrSecretKeyMismatch)
	cur, _ = secrets(alone)
	require.Equal(t, "whsec_two", cur, "nothing changed")
}

// A rotation that meets a secret neither key opens (sealed by a process with another key)
// changes nothing: no merchant is re-sealed and the deployment's key stays.
func TestRotateSecretKeyIsAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := env.OwnDatabase(t)
	oldKey, newKey := testkit.SecretKey, bytes.Repeat([]byte{9}, 32)
	open := opener(t, url)
	// Before any process recorded the deployment's key, one sealed under a stray key of its own.
	testkit.NewMerchant(t, open(bytes.Repeat([]byte{5}, 32), nil), testkit.MerchantOptions{WebhookURL: "https://b.example/hooks", WebhookSecret: "whsec_b"})
	old := open(oldKey, nil)
	require.NoError(t, old.CheckSecretKey(ctx))
	testkit.NewMerchant(t, old, testkit.MerchantOptions{WebhookURL: "https://a.example/hooks", WebhookSecret: "whsec_a"})
	before := merchantsSealed(t, old)

	_, err := open(newKey, oldKey).RotateSecretKey(ctx)
	require.ErrorContains(t, err, "decrypt webhook secret")
	require.Equal(t, before, merchantsSealed(t, old), "no secret re-sealed")
	require.NoError(t, old.CheckSecretKey(ctx), "the old key is still the deployment's")
	require.NoError(t, old.Exec(ctx, `SELECT 1 / (CASE WHEN cardinality(retired) = 0 THEN 1 ELSE 0 END) FROM secret_key_check`), "nothing retired")
}

// merchantsSealed is every merchant's sealed secret, as stored.
func merchantsSealed(t *testing.T, st *store.Store) string {
	t.Helper()
	var out string
	require.NoError(t, st.QueryRow(context.Background(), `SELECT string_agg(encode(webhook_secret_enc, 'hex'), ',' ORDER BY id) FROM merchants`, nil, &out))
	return out
}

// opener opens stores on url with a key and a previous key, closed when the test ends.
func opener(t *testing.T, url string) func(key, previous []byte) *store.Store {
	return func(key, previous []byte) *store.Store {
		t.Helper()
		st, err := store.Open(context.Background(), store.Options{URL: url, SecretKey: key, PreviousSecretKey: previous, Migrate: true})
		require.NoError(t, err)
		t.Cleanup(st.Close)
		return st
	}
}
