package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kasa-pay/kasa/store"
)

// RelayStore is what the relay needs from the database.
type RelayStore interface {
	RelayOutbox(ctx context.Context, limit int, publish func(context.Context, []store.OutboxEvent) ([]uuid.UUID, error)) (claimed, published int, err error)
	OutboxBacklog(ctx context.Context) (count int64, age time.Duration, err error)
	PurgeEvents(ctx context.Context, olderThan time.Duration, batch int) (store.Purged, error)
	UnconfirmedOutbox(ctx context.Context, q store.UnconfirmedQuery) (store.Unconfirmed, error)
}

// RelayOptions configure a Relay. Zero values take the defaults shown.
type RelayOptions struct {
	Store          RelayStore
	JetStream      jetstream.JetStream
	BatchSize      int           // rows per claim (256)
	PollInterval   time.Duration // sleep when the outbox is empty (100ms); full batches loop at once
	PublishTimeout time.Duration // wait for the broker's acks of one batch (10s)
	Retention      time.Duration // delete published outbox rows and inbox rows older than this (7 days)
	RetentionEvery time.Duration // how often retention runs (10m)
	RetentionBatch int           // rows per DELETE (1000)
	// The broker's ack is not delivery: a broker can lose what it acknowledged. An event the
	// webhook consumer's inbox (Consumer) still lacks RedeliverAfter after the ack is published
	// again, under a message id of its own (republishedMsgID), then after twice as long, and so
	// on up to redeliverBackoffMax, until RedeliverFor after the ack.
	Consumer       string        // the inbox that confirms delivery (WebhooksConsumer)
	RedeliverAfter time.Duration // (1m)
	RedeliverFor   time.Duration // (24h; at most half of Retention)
	Metrics        *Metrics
	Logger         *slog.Logger
}

// Relay publishes the outbox to JetStream. Several relays may run at once: they claim disjoint
// rows, and each aggregate's next event is claimable only after its previous one is marked
// published, i.e. acknowledged by the broker, so the stream holds every payment's events in
// commit order however many relays there are. It also publishes again what the consumer's inbox
// lacks long after the broker's ack (Redeliver).
type Relay struct {
	o      RelayOptions
	resend map[uuid.UUID]resend // events published again, and when they are next due
}

type resend struct {
	at    time.Time
	delay time.Duration
	n     int // the number of the last re-publication (republishedMsgID)
}

// redeliverBackoffMax bounds the delay between two publications of an event the inbox lacks: a
// consumer that is down for hours gets a handful of copies of each, not one per check.
const redeliverBackoffMax = 30 * time.Minute

// redeliverPages bounds the rows one check reads (that many batches): enough to keep up with
// the outbox between two checks, and a short transaction.
const redeliverPages = 64

// NewRelay applies the defaults.
func NewRelay(o RelayOptions) *Relay {
	if o.BatchSize <= 0 {
		o.BatchSize = 256
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 100 * time.Millisecond
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = 10 * time.Second
	}
	if o.Retention <= 0 {
		o.Retention = StreamMaxAge
	}
	if o.RetentionEvery <= 0 {
		o.RetentionEvery = 10 * time.Minute
	}
	if o.RetentionBatch <= 0 {
		o.RetentionBatch = 1000
	}
	if o.Consumer == "" {
		o.Consumer = WebhooksConsumer
	}
	if o.RedeliverAfter <= 0 {
		o.RedeliverAfter = time.Minute
	}
	if o.RedeliverFor <= 0 {
		o.RedeliverFor = 24 * time.Hour
	}
	// Given up (logged and counted) while the row still exists: retention deletes it unseen.
	o.RedeliverFor = min(o.RedeliverFor, o.Retention/2)
	if o.Metrics == nil {
		o.Metrics = unregistered()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Relay{o: o, resend: map[uuid.UUID]resend{}}
}

// Run ensures the stream exists, then relays until ctx is cancelled. A batch in flight is
// finished (or abandoned unmarked, to be republished and de-duplicated) before it returns.
func (r *Relay) Run(ctx context.Context) error {
	for {
		_, err := EnsureStream(ctx, r.o.JetStream)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		r.o.Logger.Warn("relay: broker not ready", "error", err)
		if !sleep(ctx, time.Second) {
			return nil
		}
	}
	r.o.Logger.Info("relay running", "stream", StreamName, "batch", r.o.BatchSize)
	nextPurge := time.Now().Add(r.o.PollInterval) // soon after start, then every RetentionEvery
	var lastStats, lastCheck time.Time
	for ctx.Err() == nil {
		claimed, err := r.RelayOnce(ctx)
		if err != nil && ctx.Err() == nil {
			r.o.Logger.Warn("relay: batch failed; retrying", "error", err)
		}
		if time.Since(lastStats) >= time.Second {
			r.observeBacklog(ctx)
			lastStats = time.Now()
		}
		// Checked four times per RedeliverAfter: a lost event goes out again at most a quarter
		// of it late.
		if time.Since(lastCheck) >= r.o.RedeliverAfter/4 {
			r.Redeliver(ctx)
			lastCheck = time.Now()
		}
		if time.Now().After(nextPurge) {
			r.Purge(ctx)
			nextPurge = time.Now().Add(r.o.RetentionEvery)
		}
		if claimed > 0 && err == nil {
			continue // more may be waiting: a full batch, or an aggregate's next event
		}
		if !sleep(ctx, r.o.PollInterval) {
			break
		}
	}
	r.o.Logger.Info("relay stopped")
	return nil
}

// RelayOnce claims one batch, publishes it and marks what the broker acknowledged. It returns the
// number of rows claimed.
func (r *Relay) RelayOnce(ctx context.Context) (int, error) {
	// The claim's transaction must end even when ctx is cancelled mid-batch.
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.PublishTimeout+5*time.Second)
	defer cancel()
	claimed, published, err := r.o.Store.RelayOutbox(bctx, r.o.BatchSize, func(ctx context.Context, events []store.OutboxEvent) ([]uuid.UUID, error) {
		acked, _, err := r.publish(ctx, events, nil)
		return acked, err
	})
	r.o.Metrics.published.Add(float64(published))
	if err != nil {
		r.o.Metrics.relayErrors.WithLabelValues("batch").Inc()
		r.ensureStream(ctx, err)
	}
	return claimed, err
}

// Redeliver publishes again the events that the consumer's inbox still lacks RedeliverAfter
// after the broker acknowledged them (it may have lost them), except those published again
// lately (the delay doubles each time). Each re-publication goes under a message id of its own
// (republishedMsgID): the broker may have lost an event while still remembering its id (a stream
// purge keeps the duplicate window), and would drop a copy under that id as a duplicate. Copies
// of an event the broker still holds are absorbed by the inbox. A re-publication the broker
// answers as a duplicate (a relay before this one's restart used its id) is not counted: the
// event is due again at the next check, under the next number. Events still missing
// RedeliverFor after their ack are given up, with an error logged.
func (r *Relay) Redeliver(ctx context.Context) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.PublishTimeout+5*time.Second)
	defer cancel()
	u, err := r.o.Store.UnconfirmedOutbox(bctx, store.UnconfirmedQuery{
		Consumer: r.o.Consumer, After: r.o.RedeliverAfter, GiveUp: r.o.RedeliverFor, Ahead: r.consumerAt(bctx),
		Page: r.o.BatchSize, Pages: redeliverPages,
	})
	if err != nil {
		if ctx.Err() == nil {
			r.o.Metrics.relayErrors.WithLabelValues("redeliver").Inc()
			r.o.Logger.Warn("relay: cannot check the inbox for published events", "error", err)
		}
		return
	}
	if u.Busy {
		return // another relay checks
	}
	for _, id := range u.GaveUp {
		r.o.Logger.Error("relay: event never reached the inbox; no longer published again", "event_id", id, "consumer", r.o.Consumer, "after", r.o.RedeliverFor)
	}
	r.o.Metrics.gaveUp.Add(float64(len(u.GaveUp)))
	now := time.Now()
	due := make([]store.OutboxEvent, 0, len(u.Due))
	kept := make(map[uuid.UUID]resend, len(u.Due))
	before := make(map[uuid.UUID]resend, len(u.Due)) // the due events' state before this check
	again := make(map[uuid.UUID]int, len(u.Due))
	for _, e := range u.Due {
		s, seen := r.resend[e.ID]
		if seen && now.Before(s.at) {
			kept[e.ID] = s
			continue
		}
		before[e.ID] = s
		delay := min(max(2*s.delay, r.o.RedeliverAfter), redeliverBackoffMax)
		kept[e.ID] = resend{at: now.Add(delay), delay: delay, n: s.n + 1}
		again[e.ID] = s.n + 1
		due = append(due, e)
	}
	r.resend = kept // events no longer due (in the inbox now) are forgotten
	if len(due) == 0 {
		return
	}
	acked, dups, err := r.publish(bctx, due, again)
	// Not sent, or not as a new message: due again at the next check, under the next number,
	// with the backoff they had.
	notNew := func(id uuid.UUID) { r.resend[id] = resend{delay: before[id].delay, n: again[id]} }
	for _, id := range dups {
		notNew(id)
	}
	if n := len(acked) - len(dups); n > 0 {
		r.o.Metrics.republished.Add(float64(n))
		r.o.Logger.Warn("relay: published again events the inbox still lacks", "events", n, "consumer", r.o.Consumer)
	}
	if len(dups) > 0 {
		r.o.Logger.Info("relay: the broker had the message ids of events published again; publishing them under the next ones", "events", len(dups))
	}
	if err != nil && ctx.Err() == nil {
		r.o.Metrics.relayErrors.WithLabelValues("redeliver").Inc()
		r.o.Logger.Warn("relay: publishing again failed; will retry", "error", err)
		sent := make(map[uuid.UUID]bool, len(acked))
		for _, id := range acked {
			sent[id] = true
		}
		for _, e := range due {
			if !sent[e.ID] {
				notNew(e.ID)
			}
		}
		r.ensureStream(ctx, err)
	}
}

// consumerAt says how far the consumer has read the stream: when the broker stored the message
// it has acked everything up to (or the stream was created, before its first ack). An event the
// inbox lacks that was published later may still be in the stream ahead of a consumer that is
// only behind, not lost: publishing it again would add to the backlog it is working through.
// Zero (every event the inbox lacks is due) when the consumer has nothing pending, or when the
// broker cannot say (no consumer yet, a message gone).
func (r *Relay) consumerAt(ctx context.Context) time.Time {
	c, err := r.o.JetStream.Consumer(ctx, StreamName, r.o.Consumer)
	if err != nil {
		return time.Time{}
	}
	info, err := c.Info(ctx)
	if err != nil || info.NumPending == 0 && info.NumAckPending == 0 {
		return time.Time{}
	}
	s, err := r.o.JetStream.Stream(ctx, StreamName)
	if err != nil {
		return time.Time{}
	}
	if info.AckFloor.Stream == 0 {
		return s.CachedInfo().Created
	}
	msg, err := s.GetMsg(ctx, info.AckFloor.Stream)
	if err != nil {
		return time.Time{}
	}
	return msg.Time
}

// republishedMsgID is the Nats-Msg-Id of an event's n-th re-publication (n ≥ 1); its first
// publication's is the event id. Consumers de-duplicate on the event id of the body, not on this.
func republishedMsgID(eventID uuid.UUID, n int) string {
	return eventID.String() + "/" + strconv.Itoa(n)
}

// ensureStream creates the stream again when a publish found none: a broker that lost its
// store comes back without it.
func (r *Relay) ensureStream(ctx context.Context, err error) {
	if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return
	}
	if _, err := EnsureStream(ctx, r.o.JetStream); err != nil && ctx.Err() == nil {
		r.o.Logger.Warn("relay: broker has no stream and creating it failed", "error", err)
	}
}

// publish sends a batch asynchronously and waits for every ack; it returns the acknowledged ids
// and, of those, the ones the broker acknowledged as duplicates of a message id it remembers.
// A batch holds at most one event per aggregate, so a partial failure cannot reorder a payment.
// again numbers re-publications (republishedMsgID); nil: the events' first publication, under
// the event id, whose latency is observed.
func (r *Relay) publish(ctx context.Context, events []store.OutboxEvent, again map[uuid.UUID]int) (acked, dups []uuid.UUID, err error) {
	futures := make([]jetstream.PubAckFuture, 0, len(events))
	sent := make([]store.OutboxEvent, 0, len(events)) // futures[i] is sent[i]'s
	var errs []error
	for _, e := range events {
		msg, err := message(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		id := e.ID.String()
		if again != nil {
			id = republishedMsgID(e.ID, again[e.ID])
		}
		f, err := r.o.JetStream.PublishMsgAsync(msg, jetstream.WithMsgID(id), jetstream.WithExpectStream(StreamName))
		if err != nil {
			errs = append(errs, fmt.Errorf("publish %s: %w", e.ID, err))
			break
		}
		futures, sent = append(futures, f), append(sent, e)
	}
	events = sent
	timeout := time.NewTimer(r.o.PublishTimeout)
	defer timeout.Stop()
	acked = make([]uuid.UUID, 0, len(futures))
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			acked = append(acked, events[i].ID)
			if ack.Duplicate {
				dups = append(dups, events[i].ID)
			}
			if again == nil {
				r.o.Metrics.publishLatency.Observe(time.Since(events[i].CreatedAt).Seconds())
			}
		case err := <-f.Err():
			errs = append(errs, fmt.Errorf("publish %s: %w", events[i].ID, err))
		case <-timeout.C:
			return acked, dups, errors.Join(append(errs, fmt.Errorf("no broker ack within %s", r.o.PublishTimeout))...)
		case <-ctx.Done():
			return acked, dups, ctx.Err()
		}
	}
	return acked, dups, errors.Join(errs...)
}

// message renders an outbox row as its broker message.
func message(e store.OutboxEvent) (*nats.Msg, error) {
	body, err := json.Marshal(Event{ID: e.ID, Type: e.Type, AggregateID: e.AggregateID, CreatedAt: e.CreatedAt, Data: e.Payload})
	if err != nil {
		return nil, fmt.Errorf("event %s: %w", e.ID, err)
	}
	msg := nats.NewMsg(Subject(e.Type))
	msg.Data = body
	msg.Header.Set(HeaderEventID, e.ID.String())
	return msg, nil
}

func (r *Relay) observeBacklog(ctx context.Context) {
	n, age, err := r.o.Store.OutboxBacklog(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.o.Metrics.relayErrors.WithLabelValues("backlog").Inc()
		}
		return
	}
	r.o.Metrics.backlog.Set(float64(n))
	r.o.Metrics.oldestAge.Set(age.Seconds())
}

// Purge applies retention once: published outbox rows, inbox rows and finished webhook
// deliveries older than Retention go,
// RetentionBatch rows per statement.
func (r *Relay) Purge(ctx context.Context) {
	p, err := r.o.Store.PurgeEvents(ctx, r.o.Retention, r.o.RetentionBatch)
	r.o.Metrics.purged.WithLabelValues("outbox").Add(float64(p.Outbox))
	r.o.Metrics.purged.WithLabelValues("inbox").Add(float64(p.Inbox))
	r.o.Metrics.purged.WithLabelValues("webhook_deliveries").Add(float64(p.Deliveries))
	if err != nil && ctx.Err() == nil {
		r.o.Metrics.relayErrors.WithLabelValues("purge").Inc()
		r.o.Logger.Warn("relay: retention failed", "error", err)
	}
	if p.Outbox+p.Inbox+p.Deliveries > 0 {
		r.o.Logger.Info("relay: retention", "outbox_deleted", p.Outbox, "inbox_deleted", p.Inbox, "deliveries_deleted", p.Deliveries)
	}
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
