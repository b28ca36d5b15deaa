package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kasa-pay/kasa/store"
)

// RelayStore is what the relay needs from the database.
type RelayStore interface {
	RelayOutbox(ctx context.Context, limit int, publish func(context.Context, []store.OutboxEvent) ([]uuid.UUID, error)) (claimed, published int, err error)
	OutboxBacklog(ctx context.Context) (count int64, oldest time.Time, err error)
	PurgeEvents(ctx context.Context, olderThan time.Duration, batch int) (store.Purged, error)
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
	Metrics        *Metrics
	Logger         *slog.Logger
}

// Relay publishes the outbox to JetStream. Several relays may run at once: they claim disjoint
// rows, and each aggregate's next event is claimable only after its previous one is marked
// published, i.e. acknowledged by the broker, so the stream holds every payment's events in
// commit order however many relays there are.
type Relay struct {
	o RelayOptions
}

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
	if o.Metrics == nil {
		o.Metrics = unregistered()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Relay{o: o}
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
	var lastStats time.Time
	for ctx.Err() == nil {
		claimed, err := r.RelayOnce(ctx)
		if err != nil && ctx.Err() == nil {
			r.o.Logger.Warn("relay: batch failed; retrying", "error", err)
		}
		if time.Since(lastStats) >= time.Second {
			r.observeBacklog(ctx)
			lastStats = time.Now()
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
	claimed, published, err := r.o.Store.RelayOutbox(bctx, r.o.BatchSize, r.publish)
	r.o.Metrics.published.Add(float64(published))
	if err != nil {
		r.o.Metrics.relayErrors.WithLabelValues("batch").Inc()
	}
	return claimed, err
}

// publish sends a batch asynchronously and waits for every ack; it returns the acknowledged ids.
// A batch holds at most one event per aggregate, so a partial failure cannot reorder a payment.
func (r *Relay) publish(ctx context.Context, events []store.OutboxEvent) ([]uuid.UUID, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(events))
	var errs []error
	for _, e := range events {
		msg, err := message(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f, err := r.o.JetStream.PublishMsgAsync(msg, jetstream.WithMsgID(e.ID.String()), jetstream.WithExpectStream(StreamName))
		if err != nil {
			errs = append(errs, fmt.Errorf("publish %s: %w", e.ID, err))
			break
		}
		futures = append(futures, f)
	}
	timeout := time.NewTimer(r.o.PublishTimeout)
	defer timeout.Stop()
	acked := make([]uuid.UUID, 0, len(futures))
	for i, f := range futures {
		select {
		case <-f.Ok():
			acked = append(acked, events[i].ID)
			r.o.Metrics.publishLatency.Observe(time.Since(events[i].CreatedAt).Seconds())
		case err := <-f.Err():
			errs = append(errs, fmt.Errorf("publish %s: %w", events[i].ID, err))
		case <-timeout.C:
			return acked, errors.Join(append(errs, fmt.Errorf("no broker ack within %s", r.o.PublishTimeout))...)
		case <-ctx.Done():
			return acked, ctx.Err()
		}
	}
	return acked, errors.Join(errs...)
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
	n, oldest, err := r.o.Store.OutboxBacklog(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.o.Metrics.relayErrors.WithLabelValues("backlog").Inc()
		}
		return
	}
	r.o.Metrics.backlog.Set(float64(n))
	age := 0.0
	if !oldest.IsZero() {
		age = time.Since(oldest).Seconds()
	}
	r.o.Metrics.oldestAge.Set(age)
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
