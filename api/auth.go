package api

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
)

// merchantCache remembers API key -> merchant for a short while: every merchant request
// authenticates, and a replay is otherwise one query of its own plus this one. Keys are kept
// hashed (payment.HashAPIKey), never in the clear.
//
// A known key is trusted for authCacheTTL from the moment its lookup began, so a key revoked on
// any instance is refused by every instance within that time without any instance telling the
// others. A wrong key is refused from memory for authMissTTL, so a client repeating one costs a
// query every authMissTTL rather than one per request; a key is random and only exists once it
// is created, so no real key is ever tried before its creation.
//
// A key this instance has not known valid may be a guess: the first of its lookups in flight
// holds one of the client's failures (authGuard) before it queries, so that guesses sent all at
// once get no more queries than the client's failed-authentication limit allows. Its other
// lookups meanwhile hold none: they guess nothing new, and a merchant's burst on a fresh
// instance is not refused.
type merchantCache struct {
	mu      sync.Mutex
	entries map[string]cachedMerchant
	misses  map[string]time.Time // key hash -> refused without a query until then
	pending map[string]int       // key hash -> lookups in flight of a key not known valid
	forgets uint64               // forgetMerchant calls: a lookup begun before one caches nothing
}

// authGuard is the failed-authentication limit of the client a lookup is made for.
type authGuard interface {
	// hold takes the chance of one failure before a query: a *rateLimitedError when the
	// client has none left. release gives it back, or spends it when the key was wrong.
	hold() (release func(failed bool), err error)
	// failed counts a wrong key that held nothing.
	failed()
}

type cachedMerchant struct {
	m       payment.Merchant
	expires time.Time
}

const (
	authCacheTTL  = 750 * time.Millisecond // a revoked key is refused everywhere within this
	authMissTTL   = 2 * time.Second        // a wrong key is refused from memory this long
	authCacheSize = 10_000                 // keys; past it the cache starts over rather than grow
	authMissSize  = 10_000                 // wrong keys, apart so that a flood of them evicts no known key
)

// lookup finds the merchant of apiKey, counting wrong keys against guard (nil: no limit).
func (c *merchantCache) lookup(ctx context.Context, apiKey string, load func(context.Context, string) (payment.Merchant, error), guard authGuard) (payment.Merchant, error) {
	h := string(payment.HashAPIKey(apiKey))
	now := time.Now() // before the query: what it reads may be revoked right after it started
	c.mu.Lock()
	e, known := c.entries[h]
	missUntil, missed := c.misses[h]
	forgets := c.forgets
	queries := !(known && now.Before(e.expires)) && !(missed && now.Before(missUntil))
	first := false
	if queries && !known {
		if c.pending == nil {
			c.pending = map[string]int{}
		}
		first = c.pending[h] == 0
		c.pending[h]++
	}
	c.mu.Unlock()
	if queries && !known {
		defer c.done(h)
	}
	if known && now.Before(e.expires) {
		return e.m, nil
	}
	if missed && now.Before(missUntil) {
		if guard != nil {
			guard.failed()
		}
		return payment.Merchant{}, payment.ErrUnauthorized
	}
	release := func(bool) {}
	held := false
	if first && guard != nil {
		r, err := guard.hold()
		if err != nil {
			return payment.Merchant{}, err
		}
		release, held = r, true
	}
	m, err := load(ctx, apiKey)
	release(errors.Is(err, payment.ErrUnauthorized))
	if errors.Is(err, payment.ErrUnauthorized) {
		if guard != nil && !held {
			guard.failed()
		}
		c.mu.Lock()
		if c.misses == nil || len(c.misses) >= authMissSize {
			c.misses = map[string]time.Time{}
		}
		c.misses[h] = now.Add(authMissTTL)
		c.mu.Unlock()
		return m, err
	}
	if err != nil {
		return m, err // the database failed: asked again next time
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.forgets != forgets {
		return m, nil // a key was revoked meanwhile, maybe this one: not cached
	}
	if c.entries == nil || len(c.entries) >= authCacheSize {
		c.entries = map[string]cachedMerchant{}
	}
	c.entries[h] = cachedMerchant{m: m, expires: now.Add(authCacheTTL)}
	return m, nil
}

// done ends a lookup of a key not known valid.
func (c *merchantCache) done(h string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending[h]--; c.pending[h] <= 0 {
		delete(c.pending, h)
	}
}

// forgetMerchant drops every cached key of a merchant: the instance that revokes a key refuses
// it at once (the others within authCacheTTL).
func (c *merchantCache) forgetMerchant(id uuid.UUID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgets++
	for h, e := range c.entries {
		if e.m.ID == id {
			delete(c.entries, h)
		}
	}
}
