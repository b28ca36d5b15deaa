package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kasa-pay/kasa/store"
)

// ConsumerStore is what the webhook consumer needs from the database.
type ConsumerStore interface {
	OutboxEvents(ctx context.Context, ids []uuid.UUID) ([]store.OutboxEvent, error)
	AcceptEvents(ctx context.Context, consumer string, es []store.NewDelivery, orderGrace time.Duration) ([]store.Acceptance, error)
}

// WebhookConsumerOptions configure a WebhookConsumer. Zero values take the defaults shown.
type WebhookConsumerOptions struct {
	Store      ConsumerStore
	JetStream  jetstream.JetStream
	Name       string        // durable consumer and inbox name (WebhooksConsumer)
	OrderGrace time.Duration // how long an event waits for an earlier event of its payment (1m)
	DeferDelay time.Duration // redelivery delay while it waits (250ms)
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
	if o.OrderGrace <= 0 {
		o.OrderGrace = time.Minute
	}
	if o.DeferDelay <= 0 {
		o.DeferDelay = 250 * time.Millisecond
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

// Run creates the stream and the durable pull consumer if missing and handles messages in
// stream order until ctx is cancelled; the messages in hand are finished first.
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
		// power loss can take all of it) has no consumer left to answer the pulls.
		it, err := cons.Messages(jetstream.PullMaxMessages(2*c.o.Batch), jetstream.WithMessagesErrOnMissingHeartbeat(true))
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
	if _, err := EnsureStream(ctx, c.o.JetStream); err != nil {
		return nil, err
	}
	return c.o.JetStream.CreateOrUpdateConsumer(ctx, StreamName, jetstream.ConsumerConfig{
		Durable:        c.o.Name,
		Description:    "kasa webhook deliveries (inbox " + c.o.Name + ")",
		FilterSubjects: webhookSubjects,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.o.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  1000,
	})
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

// handle processes messages in stream order: their inbox rows and deliveries commit together,
// then each is acked. A message only names an event: what is delivered is read from its outbox
// row, so a publisher without the database cannot have kasa sign a body it never committed. A
// message naming no outbox row is acked and dropped; one already in the inbox is acked and
// ignored; a database error, or an awaited earlier event, leaves a message to the broker's
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
	rows, err := c.o.Store.OutboxEvents(ctx, ids)
	if err != nil {
		c.retry(named, err)
		return
	}
	byID := make(map[uuid.UUID]store.OutboxEvent, len(rows))
	for _, r := range rows {
		byID[r.ID] = r
	}
	var took []jetstream.Msg
	var nds []store.NewDelivery
	for i, msg := range named {
		row, ok := byID[ids[i]]
		if !ok {
			c.o.Logger.Warn("webhook consumer: message names no outbox event; dropped", "event_id", ids[i], "subject", msg.Subject())
			c.o.Metrics.consumed.WithLabelValues("unknown").Inc()
			_ = msg.Ack()
			continue
		}
		if nd, ok := c.delivery(msg, row); ok {
			took, nds = append(took, msg), append(nds, nd)
		}
	}
	if len(nds) == 0 {
		return
	}
	accs, err := c.o.Store.AcceptEvents(ctx, c.o.Name, nds, c.o.OrderGrace)
	if err != nil {
		c.retry(took, err)
		return
	}
	for i, acc := range accs {
		msg, e := took[i], nds[i]
		c.o.Metrics.consumed.WithLabelValues(string(acc)).Inc()
		switch acc {
		case store.AcceptedDeferred:
			_ = msg.NakWithDelay(c.o.DeferDelay)
			continue
		case store.AcceptedSkipped:
			c.o.Metrics.deliveries.WithLabelValues("skipped").Inc()
		case store.AcceptedOrphan:
			c.o.Logger.Error("webhook consumer: event of an unknown payment; recorded, not delivered", "event_id", e.EventID, "payment_id", e.AggregateID)
		}
		// Acked only now, after the commit. A lost ack means a redelivery the inbox absorbs.
		if err := msg.Ack(); err != nil {
			c.o.Logger.Debug("webhook consumer: ack", "event_id", e.EventID, "error", err)
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

// delivery renders an outbox row as its delivery, with the webhook body merchants get. A row
// whose data is not JSON is dropped (terminated).
func (c *WebhookConsumer) delivery(msg jetstream.Msg, r store.OutboxEvent) (store.NewDelivery, bool) {
	nd := store.NewDelivery{EventID: r.ID, AggregateID: r.AggregateID, Type: r.Type, CreatedAt: r.CreatedAt}
	if webhookTypes[r.Type] {
		body, err := WebhookBody(Event{ID: r.ID, Type: r.Type, AggregateID: r.AggregateID, CreatedAt: r.CreatedAt, Data: r.Payload})
		if err != nil {
			c.o.Logger.Error("webhook consumer: event data is not JSON; dropped", "event_id", r.ID, "error", err)
			c.o.Metrics.consumed.WithLabelValues("invalid").Inc()
			_ = msg.TermWithReason("invalid event data")
			return store.NewDelivery{}, false
		}
		nd.Body = body
	}
	return nd, true
}
