package api

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

func TestReplayCacheKeepsOnlyFinalAnswers(t *testing.T) {
	m := payment.NewID()
	done := func(key string) store.Record {
		return store.Record{MerchantID: m, Key: key, Scope: store.ScopePayment, Status: store.RecordCompleted, Outcome: payment.StatusSucceeded, ResponseBody: []byte(`{}`)}
	}
	c := replayCache{size: 2}
	c.put(store.Record{MerchantID: m, Key: "running", Scope: store.ScopePayment, Status: store.RecordProcessing})
	c.put(store.Record{MerchantID: m, Key: "parked", Status: store.RecordUnknown})
	c.put(store.Record{MerchantID: m, Key: "unsaved", Status: store.RecordCompleted})
	for _, k := range []string{"running", "parked", "unsaved"} {
		_, ok := c.get(m, store.ScopePayment, k)
		require.False(t, ok, "%s: only completed records with their stored answer", k)
	}

	c.put(done("a"))
	c.put(done("b"))
	got, ok := c.get(m, store.ScopePayment, "a")
	require.True(t, ok)
	require.Equal(t, done("a"), got)
	_, ok = c.get(payment.NewID(), store.ScopePayment, "a")
	require.False(t, ok, "keys are per merchant")

	c.put(done("c"))                          // a new generation: a and b are previous
	_, ok = c.get(m, store.ScopePayment, "a") // used: carried into the current generation
	require.True(t, ok)
	c.put(done("d")) // current (c, a) full: b is dropped
	_, ok = c.get(m, store.ScopePayment, "b")
	require.False(t, ok, "unused records age out")
	for _, k := range []string{"a", "c", "d"} {
		_, ok := c.get(m, store.ScopePayment, k)
		require.True(t, ok, k)
	}

	off := replayCache{}
	off.put(done("a"))
	_, ok = off.get(m, store.ScopePayment, "a")
	require.False(t, ok, "size 0: off")
}

// A record that may have been deleted by retention is never answered from memory: its key may
// already name a new payment, which only the database knows.
func TestReplayCacheForgetsExpiredRecords(t *testing.T) {
	m := payment.NewID()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	finished := func(key string, ago time.Duration) store.Record {
		return store.Record{MerchantID: m, Key: key, Scope: store.ScopePayment, Status: store.RecordCompleted, Outcome: payment.StatusSucceeded,
			ResponseBody: []byte(`{}`), UpdatedAt: now.Add(-ago)}
	}
	c := replayCache{size: 2, maxAge: time.Hour, now: func() time.Time { return now }}
	c.put(finished("old", time.Hour))
	_, ok := c.get(m, store.ScopePayment, "old")
	require.False(t, ok, "not even cached once expired")

	c.put(finished("young", 59*time.Minute))
	c.put(finished("other", time.Minute))
	_, ok = c.get(m, store.ScopePayment, "young")
	require.True(t, ok)
	now = now.Add(time.Minute)
	_, ok = c.get(m, store.ScopePayment, "young")
	require.False(t, ok, "expired while cached")
	_, ok = c.get(m, store.ScopePayment, "other")
	require.True(t, ok)

	c.put(finished("third", 0)) // a new generation: other is previous
	now = now.Add(time.Hour)
	_, ok = c.get(m, store.ScopePayment, "other")
	require.False(t, ok, "expired in the previous generation")
}

// A merchant's refund keys are a key space apart from its payment keys: a refund key equal to
// a payment key must never be answered with the payment.
func TestReplayCacheKeysByScope(t *testing.T) {
	m := payment.NewID()
	paid := store.Record{MerchantID: m, Key: "k1", Scope: store.ScopePayment, Status: store.RecordCompleted,
		Outcome: payment.StatusSucceeded, ResponseBody: []byte(`{"payment":true}`)}
	c := replayCache{size: 10}
	c.put(paid)
	_, ok := c.get(m, store.ScopeRefund, "k1")
	require.False(t, ok, "the payment's key is not the refund's")
	got, ok := c.get(m, store.ScopePayment, "k1")
	require.True(t, ok)
	require.Equal(t, paid, got)

	refunded := paid
	refunded.Scope, refunded.ResponseBody = store.ScopeRefund, []byte(`{"refund":true}`)
	c.put(refunded)
	got, ok = c.get(m, store.ScopeRefund, "k1")
	require.True(t, ok)
	require.Equal(t, refunded, got)
	got, ok = c.get(m, store.ScopePayment, "k1")
	require.True(t, ok)
	require.Equal(t, paid, got, "the refund did not replace the payment")
}

// retentionAt is a deleters' retention read together with the database's clock.
type retentionAt struct {
	d  time.Duration
	at func() time.Time
}

func (r retentionAt) ShortestRetention(context.Context, time.Duration) (time.Duration, time.Time, error) {
	return r.d, r.at(), nil
}

// shortestRetention is d, read from a database whose clock is the API host's.
func shortestRetention(s *Server, d time.Duration) retentionAt {
	return retentionAt{d, s.replays.clock}
}

// A worker that deletes records sooner than this API's retention bounds the cache: a record it
// may have deleted is not answered from memory, since its key may name a new operation.
func TestReplayCacheFollowsTheWorkersRetention(t *testing.T) {
	m := payment.NewID()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	s := &Server{log: slog.New(slog.DiscardHandler), replays: replayCache{size: 10, maxAge: 72 * time.Hour, now: func() time.Time { return now }}}
	rec := store.Record{MerchantID: m, Key: "k", Scope: store.ScopePayment, Status: store.RecordCompleted, Outcome: payment.StatusFailed,
		ResponseBody: []byte(`{}`), UpdatedAt: now.Add(-30 * time.Minute)}
	s.replays.put(rec)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // one read, then it returns
	s.FollowRetentions(ctx, shortestRetention(s, time.Hour), time.Minute, time.Second)
	_, ok := s.replays.get(m, store.ScopePayment, "k")
	require.True(t, ok, "younger than the workers' hour")
	now = now.Add(31 * time.Minute)
	_, ok = s.replays.get(m, store.ScopePayment, "k")
	require.False(t, ok, "older than the workers' retention, though younger than the API's own")
	s.FollowRetentions(ctx, shortestRetention(s, 0), time.Minute, time.Second)
	s.replays.put(rec)
	_, ok = s.replays.get(m, store.ScopePayment, "k")
	require.True(t, ok, "no worker announced one: the API's own retention bounds it")
}

// A bound that grows (the shorter-retention worker stopped, or was redeployed with a longer one)
// does not bring back a record the shorter one had expired: the worker may have deleted it.
func TestReplayCacheForgetsWhenTheBoundGrows(t *testing.T) {
	m := payment.NewID()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	s := &Server{log: slog.New(slog.DiscardHandler), replays: replayCache{size: 10, maxAge: 72 * time.Hour, now: func() time.Time { return now }}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.FollowRetentions(ctx, shortestRetention(s, time.Hour), time.Minute, time.Second)
	s.replays.put(store.Record{MerchantID: m, Key: "k", Scope: store.ScopePayment, Status: store.RecordCompleted,
		Outcome: payment.StatusFailed, ResponseBody: []byte(`{}`), UpdatedAt: now.Add(-30 * time.Minute)})
	now = now.Add(40 * time.Minute) // 70 minutes old: the one-hour worker deleted it
	for _, grown := range []time.Duration{0, 2 * time.Hour} {
		s.FollowRetentions(ctx, shortestRetention(s, time.Hour), time.Minute, time.Second)
		s.FollowRetentions(ctx, shortestRetention(s, grown), time.Minute, time.Second)
		_, ok := s.replays.get(m, store.ScopePayment, "k")
		require.False(t, ok, "bound grown to %s", grown)
	}
}

type retentionUnreadable struct{}

func (retentionUnreadable) ShortestRetention(context.Context, time.Duration) (time.Duration, time.Time, error) {
	return 0, time.Time{}, errors.New("database unreachable")
}

// While the workers' retention cannot be read, a worker may have announced a shorter one and
// deleted by it: the cache answers nothing until a read succeeds again.
func TestReplayCacheStopsWhileTheRetentionIsUnreadable(t *testing.T) {
	m := payment.NewID()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	s := &Server{log: slog.New(slog.DiscardHandler), replays: replayCache{size: 10, maxAge: 72 * time.Hour, now: func() time.Time { return now }}}
	rec := store.Record{MerchantID: m, Key: "k", Scope: store.ScopePayment, Status: store.RecordCompleted, Outcome: payment.StatusFailed,
		ResponseBody: []byte(`{}`), UpdatedAt: now.Add(-30 * time.Minute)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.FollowRetentions(ctx, shortestRetention(s, 0), time.Minute, time.Second)
	s.replays.put(rec)
	s.FollowRetentions(ctx, retentionUnreadable{}, time.Minute, time.Second)
	_, ok := s.replays.get(m, store.ScopePayment, "k")
	require.False(t, ok, "answered from memory while the workers' retention was unknown")
	s.replays.put(rec)
	_, ok = s.replays.get(m, store.ScopePayment, "k")
	require.False(t, ok, "kept a record while the workers' retention was unknown")
	s.FollowRetentions(ctx, shortestRetention(s, 0), time.Minute, time.Second)
	s.replays.put(rec)
	_, ok = s.replays.get(m, store.ScopePayment, "k")
	require.True(t, ok, "a successful read brings the cache back")
}

// The workers delete a record by the database's clock (its updated_at against now()): an API
// whose own clock runs behind the database's ages its cached records by the database's too, so
// it never replays a record the workers deleted, whose key may name a new payment by now; one
// whose clock runs ahead keeps what is still in the database.
func TestReplayCacheAgesRecordsByTheDatabaseClock(t *testing.T) {
	for _, tc := range []struct {
		name string
		skew time.Duration // the database's clock minus the API host's
		age  time.Duration // the record's, by the database's clock
		want bool
	}{
		{"host behind, record deleted", 10 * time.Minute, 61 * time.Minute, false},
		{"host behind, record kept", 10 * time.Minute, 45 * time.Minute, true},
		{"host ahead, record kept", -20 * time.Minute, 50 * time.Minute, true},
		{"host ahead, record deleted", -20 * time.Minute, 61 * time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := payment.NewID()
			host := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
			database := func() time.Time { return host.Add(tc.skew) }
			s := &Server{log: slog.New(slog.DiscardHandler), replays: replayCache{size: 10, maxAge: 72 * time.Hour, now: func() time.Time { return host }}}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			s.FollowRetentions(ctx, retentionAt{time.Hour, database}, time.Minute, time.Second)
			rec := store.Record{MerchantID: m, Key: "k", Scope: store.ScopePayment, Status: store.RecordCompleted, Outcome: payment.StatusFailed,
				ResponseBody: []byte(`{}`), UpdatedAt: database().Add(-tc.age + 5*time.Minute)}
			s.replays.put(rec)
			host = host.Add(5 * time.Minute)
			_, ok := s.replays.get(m, store.ScopePayment, "k")
			require.Equal(t, tc.want, ok, "a record %s old by the database's clock, whose workers keep records an hour", tc.age)
		})
	}
}
