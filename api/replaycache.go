package api

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/store"
)

// replayCache keeps completed idempotency records in memory. A completed record never changes
// (its stored answer is final and byte-identical forever), so a cached copy is always right;
// it is filled only from records read from the database after they completed, and a miss only
// means "ask the database". It holds up to 2×size records in two generations: when the current
// one is full it becomes the previous one and the oldest generation is dropped, which keeps
// recently used records without per-entry bookkeeping. A record is answered from memory only
// while it is younger than maxAge (the idempotency retention) and than the shortest retention a
// record deleter announced (bound): once it may have been deleted, its key is a new request, and
// only the database can say whether that request was already made. A record's age is judged by
// the database's clock, which stamped it and by which the deleters delete it: this host's clock,
// behind it, would answer for a record already deleted.
type replayCache struct {
	size   int           // records per generation; 0 disables the cache
	maxAge time.Duration // since the record's operation finished; 0: no bound
	bound  atomic.Int64  // the deleters' shortest retention, in nanoseconds; 0: none known
	blind  atomic.Bool   // the deleters' retention could not be read: answer and keep nothing
	skew   atomic.Int64  // how far the database's clock is ahead of this host's, in nanoseconds, as last read
	now    func() time.Time

	mu        sync.Mutex
	cur, prev map[replayKey]store.Record
}

// replayKey is a record's primary key: a merchant's payments and its refunds each have their
// own key space, so the same key string may name one of each.
type replayKey struct {
	merchant uuid.UUID
	scope    store.Scope
	key      string
}

func (c *replayCache) get(merchant uuid.UUID, scope store.Scope, key string) (store.Record, bool) {
	if c.size == 0 || c.blind.Load() {
		return store.Record{}, false
	}
	k := replayKey{merchant, scope, key}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.cur[k]; ok {
		if c.expired(r) {
			delete(c.cur, k)
			return store.Record{}, false
		}
		return r, true
	}
	r, ok := c.prev[k]
	if !ok {
		return store.Record{}, false
	}
	delete(c.prev, k)
	if c.expired(r) {
		return store.Record{}, false
	}
	c.putLocked(k, r) // still in use: keep it when prev is dropped
	return r, true
}

// expired: the record may be gone from the database, so its key may name a new request.
func (c *replayCache) expired(r store.Record) bool {
	maxAge := c.maxAge
	if b := time.Duration(c.bound.Load()); b > 0 && (maxAge <= 0 || b < maxAge) {
		maxAge = b
	}
	if maxAge <= 0 {
		return false
	}
	return c.clock().Add(time.Duration(c.skew.Load())).Sub(r.UpdatedAt) >= maxAge
}

// clock is this host's time.
func (c *replayCache) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// setBound sets the deleters' shortest retention (0: none known) and how far the database's clock
// is ahead of this host's. A bound longer than before, or none, drops every cached record: one
// the shorter bound had expired may be deleted by now, and is answered from the database again.
func (c *replayCache) setBound(d, skew time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := time.Duration(c.bound.Load()); old > 0 && (d <= 0 || d > old) {
		c.cur, c.prev = nil, nil
	}
	c.bound.Store(int64(d))
	c.skew.Store(int64(skew))
	c.blind.Store(false)
}

// unknownBound drops every cached record and keeps none until setBound: a deleter may have
// announced a shorter retention, and deleted by it, while the announcements could not be read.
func (c *replayCache) unknownBound() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur, c.prev = nil, nil
	c.blind.Store(true)
}

// put remembers rec if it is completed with its answer stored.
func (c *replayCache) put(rec store.Record) {
	if c.size == 0 || rec.Status != store.RecordCompleted || rec.ResponseBody == nil || c.expired(rec) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.blind.Load() {
		return
	}
	c.putLocked(replayKey{rec.MerchantID, rec.Scope, rec.Key}, rec)
}

func (c *replayCache) putLocked(k replayKey, rec store.Record) {
	if c.cur == nil || len(c.cur) >= c.size {
		c.prev, c.cur = c.cur, make(map[replayKey]store.Record, c.size)
	}
	c.cur[k] = rec
}

// Retentions is where an API learns the shortest idempotency retention the deployment's record
// deleters (the workers) announced within live, and the database's clock, by which they delete
// (store.Store).
type Retentions interface {
	ShortestRetention(ctx context.Context, live time.Duration) (time.Duration, time.Time, error)
}

// FollowRetentions bounds the replay cache by the shortest retention a record deleter announced
// within live, read every interval until ctx ends: a record that a worker with a shorter retention
// than this API's deleted may name a new operation, which a cached copy would answer for. After a
// failed read the cache answers nothing until a read succeeds.
func (s *Server) FollowRetentions(ctx context.Context, src Retentions, live, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		// Read before the query: the database's time is later than that, so the skew is never
		// taken for less than it is, and a record never for younger.
		sent := s.replays.clock()
		if d, at, err := src.ShortestRetention(ctx, live); err == nil {
			s.replays.setBound(d, at.Sub(sent))
		} else if s.replays.unknownBound(); ctx.Err() == nil {
			s.log.Warn("reading the workers' idempotency retention; replays come from the database until it is read", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
