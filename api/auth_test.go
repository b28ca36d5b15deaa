package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
	first, err := c.lookup(ctx, "sk_a", load, nil)
	require.NoError(t, err)
	for range 3 {
		m, err := c.lookup(ctx, "sk_a", load, nil)
		require.NoError(t, err)
		require.Equal(t, first, m)
	}
	require.Equal(t, 1, loads["sk_a"], "one query per TTL")
	for range 2 {
		_, err := c.lookup(ctx, "sk_wrong", load, nil)
		require.True(t, errors.Is(err, payment.ErrUnauthorized))
		_, err = c.lookup(ctx, "sk_down", load, nil)
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
	_, err = c.lookup(ctx, "sk_a", load, nil)
	require.NoError(t, err)
	require.Equal(t, 2, loads["sk_a"])
	_, err = c.lookup(ctx, "sk_wrong", load, nil)
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

// slowAuth holds the first key lookup, once it has read the key, until release is closed.
type slowAuth struct {
	*fakeStore
	read, release chan struct{}
	once          sync.Once
}

func (s *slowAuth) MerchantByAPIKey(ctx context.Context, apiKey string) (payment.Merchant, error) {
	m, err := s.fakeStore.MerchantByAPIKey(ctx, apiKey)
	s.once.Do(func() { close(s.read); <-s.release })
	return m, err
}

// A lookup that read a key just before its revocation does not cache it after: the instance
// that revoked the key refuses it from the revocation's answer on (docs/api.md).
func TestRevokingInstanceRefusesAtOnce(t *testing.T) {
	st := &slowAuth{fakeStore: newFakeStore(), read: make(chan struct{}), release: make(chan struct{})}
	h := New(Options{Store: st, Workflows: &fakeWorkflows{st: st.fakeStore}, AdminToken: "adm", Logger: slog.New(slog.DiscardHandler)}).Handler()
	get := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request{method: http.MethodGet, path: "/v1/payments?idempotency_key=none"}.build())
		return rec.Code
	}
	first := make(chan int)
	go func() { first <- get() }()
	<-st.read
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request{method: http.MethodDelete, path: "/admin/v1/merchants/" + merchantA.String() + "/api-keys/" + keyA.String()}.build())
	require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	close(st.release)
	require.Equal(t, http.StatusNotFound, <-first, "the request that began before the revocation")
	require.Equal(t, http.StatusUnauthorized, get(), "a request after the revocation's answer")
}
