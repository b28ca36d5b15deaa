package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kasa-pay/kasa/store"
)

// ConsumerStore is what the webhook consumer needs from the database.
type ConsumerStore interface {
	EventsToRecord(ctx context.Context, consumer string, ids []uuid.UUID) ([]store.OutboxEvent, error)
	AcceptEvents(ctx context.Context, consumer string, es []store.NewDelivery) ([]store.Acceptance, error)
	ConfirmedAt(ctx context.Context, consumer string) (at, now time.Time, ok bool, err error)
}

// WebhookConsumerOptions configure a WebhookConsumer. Zero values take the defaults shown.
type WebhookConsumerOptions struct {
	Store      ConsumerStore
	JetStream  jetstream.JetStream
	Name       string        // durable consumer and inbox name (WebhooksConsumer)
	RetryDelay time.Duration // redelivery delay after a database error (1s)
	AckWait    time.Duration // the broker redelivers an unacked message after this (30s)
	Batch      int           // most messages recorded in one transaction (64)
	Metrics    *Metrics
	Logger     *slog.Logger
}

// WebhookConsumer turns broker messages into webhook deliveries, once per event id.
type WebhookConsumer struct {
	o WebhookConsumerOptions
}

// NewWebhookConsumer applies the defaults.
func NewWebhookConsumer(o WebhookConsumerOptions) *WebhookConsumer {
	if o.Name == "" {
		o.Name = WebhooksConsumer
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = time.Second
	}
	if o.AckWait <= 0 {
		o.AckWait = 30 * time.Second
	}
	if o.Batch <= 0 {
		o.Batch = 64
	}
	if o.Metrics == nil {
		o.Metrics = unregistered()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &WebhookConsumer{o: o}
}

// pullExpiry is how long one pull request waits on the broker (its heartbeats come at half that).
const pullExpiry = 5 * time.Second

// Run creates the stream and the durable pull consumer if missing and takes messages in stream
// order (handle records their events in commit order) until ctx is cancelled; the messages in
// hand are finished first.
func (c *WebhookConsumer) Run(ctx context.Context) error {
	var cons jetstream.Consumer
	for {
		var err error
		if cons, err = c.consumer(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		c.o.Logger.Warn("webhook consumer: broker not ready", "error", err)
		if !sleep(ctx, time.Second) {
			return nil
		}
	}
	c.o.Logger.Info("webhook consumer running", "consumer", c.o.Name)
	for ctx.Err() == nil {
		// Missing heartbeats end the iterator: a broker that restarted without its store (a
		// power loss can take all of it) has no consumer left to answer the pulls. Pulls that
		// expire in 5 s (not the library's 30) send a heartbeat every 2.5 s, so that is seen
		// within seconds and webhooks resume, at the cost of a pull request every 5 s.
		it, err := cons.Messages(jetstream.PullMaxMessages(2*c.o.Batch), jetstream.PullExpiry(pullExpiry),
			jetstream.WithMessagesErrOnMissingHeartbeat(true))
		if err == nil {
			c.drain(ctx, it)
		} else {
			c.o.Logger.Warn("webhook consumer: pull", "error", err)
		}
		sleep(ctx, 100*time.Millisecond) // the iterator broke (connection lost): do not spin
		// Create the stream and the consumer again if the broker lost them; the inbox absorbs
		// what the new consumer reads twice, and the relay publishes again what was lost.
		if again, err := c.consumer(ctx); err == nil {
			cons = again
		} else if ctx.Err() == nil {
			c.o.Logger.Warn("webhook consumer: broker not ready", "error", err)
			sleep(ctx, time.Second)
		}
	}
	c.o.Logger.Info("webhook consumer stopped")
	return nil
}

func (c *WebhookConsumer) consumer(ctx context.Context) (jetstream.Consumer, error) {
	stream, err := EnsureStream(ctx, c.o.JetStream)
	if err != nil {
		return nil, err
	}
	cfg := jetstream.ConsumerConfig{
		Durable:        c.o.Name,
		Description:    "kasa webhook deliveries (inbox " + c.o.Name + ")",
		FilterSubjects: webhookSubjects,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.o.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  1000,
	}
	existing, err := c.o.JetStream.Consumer(ctx, StreamName, c.o.Name)
	switch {
	case err == nil: // where it starts cannot change
		cfg.DeliverPolicy, cfg.OptStartTime = existing.CachedInfo().Config.DeliverPolicy, existing.CachedInfo().Config.OptStartTime
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, err
	default:
		// A consumer lost while its stream was kept starts where the inbox is known complete,
		// not a week of events back. The point is the database's time and the messages carry the
		// broker's, which may be minutes off: the point is taken as its age before the broker's now,
		// less the time the two reads took.
		sent := time.Now()
		at, dbNow, ok, err := c.o.Store.ConfirmedAt(ctx, c.o.Name)
		if err != nil {
			return nil, err
		}
		if ok {
			info, err := stream.Info(ctx)
			if err != nil {
				return nil, err
			}
			start := info.TimeStamp.Add(-dbNow.Sub(at) - time.Since(sent))
			cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
		}
	}
	return c.o.JetStream.CreateOrUpdateConsumer(ctx, StreamName, cfg)
}

// drain handles messages until ctx ends or the iterator breaks, then stops it. It waits for
// one message, then takes those already arrived behind it (up to Batch) and records them
// together: under load the transactions grow instead of queueing up, and a lone message waits
// for nothing.
func (c *WebhookConsumer) drain(ctx context.Context, it jetstream.MessagesContext) {
	arrived := make(chan jetstream.Msg, c.o.Batch)
	stop, pumped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pumped)
		defer close(arrived)
		for {
			msg, err := it.Next(jetstream.NextContext(ctx))
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
				errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
				if err != nil && ctx.Err() == nil {
					c.o.Logger.Info("webhook consumer: pull ended; subscribing again", "error", err)
				}
				return
			}
			if err != nil {
				c.o.Logger.Debug("webhook consumer: next", "error", err)
				continue
			}
			select {
			case arrived <- msg:
			case <-stop:
				return
			}
		}
	}()
	// Messages taken but not handled when ctx ends are neither acked nor lost: the broker
	// redelivers them.
	defer func() {
		close(stop)
		it.Stop()
		<-pumped
	}()
	for {
		msg, ok := <-arrived
		if !ok || ctx.Err() != nil {
			return
		}
		msgs := []jetstream.Msg{msg}
	more:
		for len(msgs) < c.o.Batch {
			select {
			case m, ok := <-arrived:
				if !ok {
					break more
				}
				msgs = append(msgs, m)
			default:
				break more
			}
		}
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		c.handle(hctx, msgs)
		cancel()
	}
}

// handle records the events messages name, each after every earlier event of its aggregate that
// the inbox lacks (the broker lost it, or holds it further on): the outbox keeps an aggregate's
// order, the broker only rings the bell. All are recorded in commit order, which every consumer
// follows, so two consumers' transactions never wait on each other's rows in a cycle. Inbox rows
// and deliveries commit together, then each message is acked. A message only names an event:
// what is delivered is read from its outbox row, so a publisher without the database cannot have
// kasa sign a body it never committed. A message naming no outbox row is acked and dropped; one
// already in the inbox is acked and ignored; a database error leaves the messages to the broker's
// redelivery.
func (c *WebhookConsumer) handle(ctx context.Context, msgs []jetstream.Msg) {
	var named []jetstream.Msg
	var ids []uuid.UUID
	for _, msg := range msgs {
		if id, ok := c.pointer(msg); ok {
			named, ids = append(named, msg), append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	rows, err := c.o.Store.EventsToRecord(ctx, c.o.Name, ids)
	if err != nil {
		c.retry(named, err)
		return
	}
	msgsOf := make(map[uuid.UUID][]jetstream.Msg, len(named))
	for i, msg := range named {
		msgsOf[ids[i]] = append(msgsOf[ids[i]], msg)
	}
	var nds []store.NewDelivery
	var acks [][]jetstream.Msg // the messages naming each of nds: none for an earlier event
	for _, r := range rows {
		ms := msgsOf[r.ID]
		delete(msgsOf, r.ID)
		nd, err := c.delivery(r)
		if err != nil {
			c.o.Logger.Error("webhook consumer: event data is not JSON; dropped", "event_id", r.ID, "error", err)
			for _, msg := range ms {
				c.o.Metrics.consumed.WithLabelValues("invalid").Inc()
				_ = msg.TermWithReason("invalid event data")
			}
			continue
		}
		nds, acks = append(nds, nd), append(acks, ms)
	}
	for id, ms := range msgsOf {
		for _, msg := range ms {
			c.o.Logger.Warn("webhook consumer: message names no outbox event; dropped", "event_id", id, "subject", msg.Subject())
			c.o.Metrics.consumed.WithLabelValues("unknown").Inc()
			_ = msg.Ack()
		}
	}
	if len(nds) == 0 {
		return
	}
	accs, err := c.o.Store.AcceptEvents(ctx, c.o.Name, nds)
	if err != nil {
		c.retry(slices.Concat(acks...), err)
		return
	}
	for i, acc := range accs {
		e := nds[i]
		switch acc {
		case store.AcceptedSkipped:
			c.o.Metrics.deliveries.WithLabelValues("skipped").Inc()
		case store.AcceptedOrphan:
			c.o.Logger.Error("webhook consumer: event of an unknown payment or refund; recorded, not delivered", "event_id", e.EventID, "aggregate_id", e.AggregateID)
		}
		if len(acks[i]) == 0 && acc != store.AcceptedDuplicate {
			c.o.Logger.Debug("webhook consumer: earlier event taken from the outbox ahead of its message", "event_id", e.EventID, "aggregate_id", e.AggregateID)
			c.o.Metrics.consumed.WithLabelValues("from_outbox").Inc()
		}
		for n, msg := range acks[i] {
			if n > 0 {
				acc = store.AcceptedDuplicate // the same event twice in the batch
			}
			c.o.Metrics.consumed.WithLabelValues(string(acc)).Inc()
			// Acked only now, after the commit. A lost ack means a redelivery the inbox absorbs.
			if err := msg.Ack(); err != nil {
				c.o.Logger.Debug("webhook consumer: ack", "event_id", e.EventID, "error", err)
			}
		}
	}
}

// retry hands messages back to the broker after a database error.
func (c *WebhookConsumer) retry(msgs []jetstream.Msg, err error) {
	c.o.Logger.Warn("webhook consumer: cannot record events; will retry", "events", len(msgs), "error", err)
	c.o.Metrics.consumed.WithLabelValues("error").Add(float64(len(msgs)))
	for _, msg := range msgs {
		_ = msg.NakWithDelay(c.o.RetryDelay)
	}
}

// pointer reads the event id a message names: the "id" of its JSON body (the relay's Event).
// Nothing else of the message is used. A message without one is dropped (terminated).
func (c *WebhookConsumer) pointer(msg jetstream.Msg) (uuid.UUID, bool) {
	var e struct {
		ID uuid.UUID `json:"id"`
	}
	if err := json.Unmarshal(msg.Data(), &e); err != nil || e.ID == uuid.Nil {
		c.o.Logger.Error("webhook consumer: invalid event; dropped", "subject", msg.Subject(), "error", err)
		c.o.Metrics.consumed.WithLabelValues("invalid").Inc()
		_ = msg.TermWithReason("invalid event")
		return uuid.Nil, false
	}
	return e.ID, true
}

// delivery renders an outbox row as its delivery, with the webhook body merchants get; it fails
// when the row's data is not JSON.
func (c *WebhookConsumer) delivery(r store.OutboxEvent) (store.NewDelivery, error) {
	nd := store.NewDelivery{EventID: r.ID, AggregateID: r.AggregateID, Type: r.Type, CreatedAt: r.CreatedAt}
	if webhookTypes[r.Type] {
		body, err := WebhookBody(Event{ID: r.ID, Type: r.Type, AggregateID: r.AggregateID, CreatedAt: r.CreatedAt, Data: r.Payload})
		if err != nil {
			return store.NewDelivery{}, err
		}
		nd.Body = body
	}
	return nd, nil
}
