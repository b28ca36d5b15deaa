package api

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

func TestMerchantCacheLoadsOncePerTTLAndNeverCachesFailures(t *testing.T) {
	var c merchantCache
	loads := map[string]int{}
	load := func(_ context.Context, key string) (payment.Merchant, error) {
		loads[key]++
		if key == "sk_wrong" {
			return payment.Merchant{}, payment.ErrUnauthorized
		}
		return payment.Merchant{ID: payment.NewID(), Name: key}, nil
	}
	ctx := context.Background()
	first, err := c.lookup(ctx, "sk_a", load)
	require.NoError(t, err)
	for range 3 {
		m, err := c.lookup(ctx, "sk_a", load)
		require.NoError(t, err)
		require.Equal(t, first, m)
	}
	require.Equal(t, 1, loads["sk_a"], "one query per TTL")
	for range 2 {
		_, err := c.lookup(ctx, "sk_wrong", load)
		require.True(t, errors.Is(err, payment.ErrUnauthorized))
	}
	require.Equal(t, 2, loads["sk_wrong"], "a failure is asked again")

	// Expired: asked again.
	c.mu.Lock()
	e := c.entries[string(payment.HashAPIKey("sk_a"))]
	e.expires = time.Now().Add(-time.Second)
	c.entries[string(payment.HashAPIKey("sk_a"))] = e
	c.mu.Unlock()
	_, err = c.lookup(ctx, "sk_a", load)
	require.NoError(t, err)
	require.Equal(t, 2, loads["sk_a"])
	for k := range c.entries {
		require.NotContains(t, k, "sk_a", "keys are kept hashed")
	}
}
