package store_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

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
