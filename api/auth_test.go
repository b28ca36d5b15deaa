package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
)

func TestMerchantCacheLoadsOncePerTTL(t *testing.T) {
	var c merchantCache
	loads := map[string]int{}
	load := func(_ context.Context, key string) (payment.Merchant, error) {
		loads[key]++
		switch key {
		case "sk_wrong":
			return payment.Merchant{}, payment.ErrUnauthorized
		case "sk_down":
			return payment.Merchant{}, payment.ErrUnavailable
		}
		return payment.Merchant{ID: merchantA, Name: key}, nil
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
		_, err = c.lookup(ctx, "sk_down", load)
		require.True(t, errors.Is(err, payment.ErrUnavailable))
	}
	require.Equal(t, 1, loads["sk_wrong"], "a wrong key is refused from memory")
	require.Equal(t, 2, loads["sk_down"], "a database failure is asked again")

	// Expired: asked again.
	h := string(payment.HashAPIKey("sk_a"))
	c.mu.Lock()
	e := c.entries[h]
	e.expires = time.Now().Add(-time.Millisecond)
	c.entries[h] = e
	c.misses[string(payment.HashAPIKey("sk_wrong"))] = time.Now().Add(-time.Millisecond)
	c.mu.Unlock()
	_, err = c.lookup(ctx, "sk_a", load)
	require.NoError(t, err)
	require.Equal(t, 2, loads["sk_a"])
	_, err = c.lookup(ctx, "sk_wrong", load)
	require.True(t, errors.Is(err, payment.ErrUnauthorized))
	require.Equal(t, 2, loads["sk_wrong"], "a miss is remembered only briefly")
	for k := range c.entries {
		require.NotContains(t, k, "sk_a", "keys are kept hashed")
	}
	for k := range c.misses {
		require.NotContains(t, k, "sk_wrong", "keys are kept hashed")
	}

	// Revoking on this instance forgets the merchant's keys at once.
	c.forgetMerchant(first.ID)
	require.Empty(t, c.entries)
}

// A flood of requests with one wrong key must not cost a database query each: the miss is
// remembered briefly.
func TestWrongKeyFloodCostsOneLookup(t *testing.T) {
	t.Parallel()
	st := newFakeStore()
	h := New(Options{Store: st, Workflows: &fakeWorkflows{st: st}, AdminToken: "adm", Logger: slog.New(slog.DiscardHandler)}).Handler()
	for range 100 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request{method: "GET", path: "/v1/accounts/" + accountA.String(), header: map[string]string{"Authorization": "Bearer sk_nobody"}}.build())
		require.Equal(t, http.StatusUnauthorized, rec.Code)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	require.Equal(t, 1, st.calls["MerchantByAPIKey"], "100 requests with one wrong key")
}

// A merchant's name is at most 200 characters, not bytes: "ş" takes two.
func TestMerchantNameCountsCharacters(t *testing.T) {
	t.Parallel()
	st := newFakeStore()
	h := New(Options{Store: st, Workflows: &fakeWorkflows{st: st}, AdminToken: "adm", Logger: slog.New(slog.DiscardHandler)}).Handler()
	for n, want := range map[int]int{200: http.StatusCreated, 201: http.StatusBadRequest} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request{method: http.MethodPost, path: "/admin/v1/merchants", body: `{"name":"` + strings.Repeat("ş", n) + `"}`}.build())
		require.Equal(t, want, rec.Code, "%d characters: %s", n, rec.Body)
	}
}
