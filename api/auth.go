package api

import (
	"context"
	"sync"
	"time"

	"github.com/kasa-pay/kasa/payment"
)

// merchantCache remembers API key -> merchant for a short while: every merchant request
// authenticates, and a replay is otherwise one query of its own plus this one. Keys are kept
// hashed (payment.HashAPIKey), never in the clear. A key's merchant never changes and keys are
// not revoked yet; when they are, revocation takes effect within authCacheTTL.
type merchantCache struct {
	mu      sync.Mutex
	entries map[string]cachedMerchant
}

type cachedMerchant struct {
	m       payment.Merchant
	expires time.Time
}

const (
	authCacheTTL  = 30 * time.Second
	authCacheSize = 10_000 // merchants; past it the cache starts over rather than grow
)

func (c *merchantCache) lookup(ctx context.Context, apiKey string, load func(context.Context, string) (payment.Merchant, error)) (payment.Merchant, error) {
	h := string(payment.HashAPIKey(apiKey))
	now := time.Now()
	c.mu.Lock()
	e, ok := c.entries[h]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.m, nil
	}
	m, err := load(ctx, apiKey)
	if err != nil {
		return m, err // failures are not cached: a wrong key costs its caller a query each time
	}
	c.mu.Lock()
	if c.entries == nil || len(c.entries) >= authCacheSize {
		c.entries = map[string]cachedMerchant{}
	}
	c.entries[h] = cachedMerchant{m: m, expires: now.Add(authCacheTTL)}
	c.mu.Unlock()
	return m, nil
}
