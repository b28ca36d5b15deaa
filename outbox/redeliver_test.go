package outbox

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// newWipeableBroker is an embedded broker that wipe restarts on the same address with its store
// directory gone: what a power loss leaves of a broker that acknowledged messages it had not
// written to disk yet (at worst: its streams and consumers too). Clients reconnect by themselves.
func newWipeableBroker(t *testing.T) (*broker, func()) {
	t.Helper()
	dir := t.TempDir()
	url, stop, err := startEmbedded(dir, -1)
	require.NoError(t, err)
	port, err := strconv.Atoi(url[strings.LastIndex(url, ":")+1:])
	require.NoError(t, err)
	nc, js, err := Connect(url, "outbox-test", BrokerAuth{})
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close(); stop() })
	_, err = EnsureStream(context.Background(), js)
	require.NoError(t, err)
	wipe := func() {
		stop()
		require.NoError(t, os.RemoveAll(dir))
		_, stop, err = startEmbedded(dir, port)
		require.NoError(t, err)
		require.Eventually(t, nc.IsConnected, 10*time.Second, 10*time.Millisecond, "the client reconnects")
	}
	return &broker{js: js}, wipe
}

// An event the broker acknowledged and then lost still reaches the merchant, once: the relay
// publishes again what the webhook consumer's inbox lacks. Then the broker loses everything
// while the consumer runs, and the next event arrives once too.
func TestAcknowledgedThenLostEventIsDeliveredOnce(t *testing.T) {
	ctx := context.Background()
	b, wipe := newWipeableBroker(t)
	h := newHook(t, answer(http.StatusNoContent))
	m := newMerchant(t, h.URL)
	pid := settle(t, m, false)
	ev := peek(t, pid)

	// The relay publishes the event and the broker acknowledges it; no consumer has read it.
	relay := NewRelay(RelayOptions{Store: db, JetStream: b.js, Logger: quiet})
	for {
		n, err := relay.RelayOnce(ctx)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	progress, err := db.OutboxProgress(ctx, WebhooksConsumer, []uuid.UUID{ev.ID})
	require.NoError(t, err)
	require.NotNil(t, progress[0].PublishedAt, "the broker acknowledged it")
	require.False(t, progress[0].Inboxed)
	require.NotZero(t, b.streamMsgs(t))

	wipe()
	_, err = b.js.Stream(ctx, StreamName)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound, "the broker lost the stream and the event in it")

	redeliverAfter := 300 * time.Millisecond
	p := startPipeline(t, b, pipelineOptions{relays: 1, redeliverAfter: redeliverAfter})
	require.Eventually(t, func() bool { return h.Count() == 1 }, 30*time.Second, 20*time.Millisecond, "the lost event is delivered")
	time.Sleep(10 * redeliverAfter)
	require.Equal(t, 1, h.Count(), "exactly one webhook")
	require.Equal(t, ev.ID.String(), h.Requests()[0].EventID)
	require.GreaterOrEqual(t, value(t, p.metrics.republished), 1.0)
	progress, err = db.OutboxProgress(ctx, WebhooksConsumer, []uuid.UUID{ev.ID})
	require.NoError(t, err)
	require.True(t, progress[0].Inboxed, "the webhook consumer's inbox holds it")
	ds, err := db.PaymentDeliveries(ctx, pid)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, store.DeliveryDelivered, ds[0].Status)

	// The broker loses everything again, this time under a running relay and consumer.
	wipe()
	pid2 := settle(t, m, false)
	require.Eventually(t, func() bool { return h.Count() == 2 }, 60*time.Second, 20*time.Millisecond, "the next event is delivered")
	time.Sleep(10 * redeliverAfter)
	require.Equal(t, 2, h.Count(), "exactly one webhook each")
	ds, err = db.PaymentDeliveries(ctx, pid2)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, store.DeliveryDelivered, ds[0].Status)
	progress, err = db.OutboxProgress(ctx, WebhooksConsumer, []uuid.UUID{ds[0].ID})
	require.NoError(t, err)
	require.NotNil(t, progress[0].PublishedAt)
	require.True(t, progress[0].Inboxed)
}

// A lost event whose broker stays down a while still reaches the merchant before the payment's
// next event: the next one, published first when the broker is back, brings it from the outbox.
func TestLostEventKeepsOrderAfterALongOutage(t *testing.T) {
	ctx := context.Background()
	b, wipe := newWipeableBroker(t)
	h := newHook(t, answer(http.StatusNoContent))
	m := newMerchant(t, h.URL)
	pid := settle(t, m, true) // payment.unknown, then payment.succeeded
	first := peek(t, pid)
	require.Equal(t, "payment.unknown", first.Type)

	redeliverAfter := 300 * time.Millisecond
	relay := NewRelay(RelayOptions{Store: db, JetStream: b.js, RedeliverAfter: redeliverAfter, Logger: quiet})
	_, err := relay.RelayOnce(ctx)
	require.NoError(t, err)
	progress, err := db.OutboxProgress(ctx, WebhooksConsumer, []uuid.UUID{first.ID})
	require.NoError(t, err)
	require.NotNil(t, progress[0].PublishedAt, "the broker acknowledged the first event")

	time.Sleep(3 * redeliverAfter) // down for a while
	wipe()
	require.Eventually(t, func() bool { // back: the next event goes out first
		_, _ = relay.RelayOnce(ctx)
		n, _, err := db.OutboxBacklog(ctx)
		return err == nil && n == 0
	}, 10*time.Second, 20*time.Millisecond)

	metrics := NewMetrics(prometheus.NewRegistry())
	testkit.RunUntilEnd(t,
		NewWebhookConsumer(WebhookConsumerOptions{Store: db, JetStream: b.js,
			Metrics: metrics, Logger: quiet}),
		NewWebhookSender(WebhookSenderOptions{Store: db, AllowPrivate: true, PollInterval: 20 * time.Millisecond,
			BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Metrics: metrics, Logger: quiet}),
	)
	time.Sleep(redeliverAfter / 4) // the relay's next look for lost events
	relay.Redeliver(ctx)

	require.Eventually(t, func() bool { return h.Count() == 2 }, 20*time.Second, 20*time.Millisecond, "both events delivered")
	require.Equal(t, first.ID.String(), h.Requests()[0].EventID, "payment.unknown first; got %s", h.Requests()[0].Body)
}

// A stream purge loses an event the broker acknowledged, and the payment's next event, the only
// one in the stream, reaches the consumer first: the lost one still reaches the merchant first.
func TestPurgedEventKeepsOrder(t *testing.T) {
	ctx := context.Background()
	st, b := ownStore(t), newBroker(t)
	h := newHook(t, answer(http.StatusNoContent))
	settleIn(t, st, newMerchantIn(t, st, h.URL), true) // payment.unknown, then payment.succeeded

	redeliverAfter := 2 * time.Second
	require.Less(t, 4*redeliverAfter, DuplicateWindow)
	metrics := NewMetrics(prometheus.NewRegistry())
	relay := NewRelay(RelayOptions{Store: st, JetStream: b.js, RedeliverAfter: redeliverAfter, Metrics: metrics, Logger: quiet})
	var first uuid.UUID
	_, _, err := st.RelayOutbox(ctx, 10, func(ctx context.Context, evs []store.OutboxEvent) ([]uuid.UUID, error) {
		require.Len(t, evs, 1, "one event per payment and batch")
		first = evs[0].ID
		acked, _, err := relay.publish(ctx, evs, nil)
		return acked, err
	})
	require.NoError(t, err)
	s, err := b.js.Stream(ctx, StreamName)
	require.NoError(t, err)
	require.NoError(t, s.Purge(ctx))
	_, err = relay.RelayOnce(ctx) // payment.succeeded: the only event in the stream
	require.NoError(t, err)
	require.Equal(t, uint64(1), b.streamMsgs(t))

	testkit.RunUntilEnd(t,
		relay,
		NewWebhookConsumer(WebhookConsumerOptions{Store: st, JetStream: b.js, Metrics: metrics, Logger: quiet}),
		NewWebhookSender(WebhookSenderOptions{Store: st, AllowPrivate: true, Metrics: metrics, Logger: quiet}))
	require.Eventually(t, func() bool { return h.Count() > 0 }, 30*time.Second, 20*time.Millisecond, "an event delivered")
	require.Equal(t, first.String(), h.Requests()[0].EventID, "payment.unknown first; got %s", h.Requests()[0].Body)
	require.Eventually(t, func() bool { return h.Count() == 2 }, 30*time.Second, 20*time.Millisecond, "both events delivered")
}

// A re-publication the broker answers as a duplicate (a relay before a restart used its message
// id within the duplicate window) is not counted as published again: the next check publishes
// the event under the next id.
func TestRepublicationAnsweredAsDuplicateIsNotCounted(t *testing.T) {
	ctx := context.Background()
	st, b := ownStore(t), newBroker(t)
	settleIn(t, st, newMerchantIn(t, st, "http://127.0.0.1:9/hook"), false) // no consumer: never inboxed

	redeliverAfter := 200 * time.Millisecond
	relay := func(m *Metrics) *Relay {
		return NewRelay(RelayOptions{Store: st, JetStream: b.js, RedeliverAfter: redeliverAfter, Metrics: m, Logger: quiet})
	}
	before, after := NewMetrics(prometheus.NewRegistry()), NewMetrics(prometheus.NewRegistry())
	first := relay(before)
	n, err := first.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	time.Sleep(redeliverAfter)

	first.Redeliver(ctx)
	require.Equal(t, 1.0, value(t, before.republished))
	require.Equal(t, uint64(2), b.streamMsgs(t), "a copy the broker took, not one it dropped as a duplicate")

	restarted := relay(after) // knows nothing of the re-publication before
	restarted.Redeliver(ctx)
	require.Zero(t, value(t, after.republished), "the broker dropped it as a duplicate")
	require.Equal(t, uint64(2), b.streamMsgs(t))
	restarted.Redeliver(ctx)
	require.Equal(t, 1.0, value(t, after.republished), "under the next message id")
	require.Equal(t, uint64(3), b.streamMsgs(t))
}

// A consumer far behind when the broker lost a payment's event (before, a consumer behind by more
// than the relay's redelivery delay delivered the next one first) still delivers that event
// before the payment's next one: the next one, read first, brings it from the outbox.
func TestLostEventKeepsOrderWhileTheConsumerLags(t *testing.T) {
	ctx := context.Background()
	b, wipe := newWipeableBroker(t)
	h := newHook(t, answer(http.StatusNoContent))
	m := newMerchant(t, h.URL)
	pid := settle(t, m, true) // payment.unknown, then payment.succeeded
	first := peek(t, pid)
	require.Equal(t, "payment.unknown", first.Type)

	redeliverAfter := 300 * time.Millisecond
	relay := NewRelay(RelayOptions{Store: db, JetStream: b.js, RedeliverAfter: redeliverAfter, Logger: quiet})
	_, err := relay.RelayOnce(ctx)
	require.NoError(t, err)
	wipe() // the broker loses the first event
	require.Eventually(t, func() bool {
		_, _ = relay.RelayOnce(ctx)
		n, _, err := db.OutboxBacklog(ctx)
		return err == nil && n == 0
	}, 10*time.Second, 20*time.Millisecond)
	time.Sleep(3 * redeliverAfter) // the consumer is behind by more than the redelivery delay

	metrics := NewMetrics(prometheus.NewRegistry())
	testkit.RunUntilEnd(t,
		NewWebhookConsumer(WebhookConsumerOptions{Store: db, JetStream: b.js,
			Metrics: metrics, Logger: quiet}),
		NewWebhookSender(WebhookSenderOptions{Store: db, AllowPrivate: true, PollInterval: 20 * time.Millisecond,
			BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Metrics: metrics, Logger: quiet}),
	)
	require.Eventually(t, func() bool { return h.Count() > 0 }, 20*time.Second, 20*time.Millisecond, "an event delivered")
	relay.Redeliver(ctx) // the relay's look for lost events, after the consumer read what it holds
	require.Eventually(t, func() bool { return h.Count() == 2 }, 20*time.Second, 20*time.Millisecond, "both events delivered")
	require.Equal(t, first.ID.String(), h.Requests()[0].EventID, "payment.unknown first; got %s", h.Requests()[0].Body)
	time.Sleep(10 * redeliverAfter)
	require.Equal(t, 2, h.Count(), "each event once")
}

// A consumer that is only behind is not sent copies of what the stream still holds ahead of it:
// the relay publishes again only events published before the last message the consumer has
// acked everything up to, or every event the inbox lacks once the consumer has nothing pending.
func TestLaggingConsumerGetsNoCopies(t *testing.T) {
	ctx := context.Background()
	st, b := ownStore(t), newBroker(t)
	m := newMerchantIn(t, st, "http://127.0.0.1:9/hook")
	consumer := NewWebhookConsumer(WebhookConsumerOptions{Store: st, JetStream: b.js, Logger: quiet})
	_, err := consumer.consumer(ctx) // the durable consumer exists, and reads nothing yet
	require.NoError(t, err)

	redeliverAfter := 200 * time.Millisecond
	metrics := NewMetrics(prometheus.NewRegistry())
	relay := NewRelay(RelayOptions{Store: st, JetStream: b.js, RedeliverAfter: redeliverAfter, Metrics: metrics, Logger: quiet})
	for range 3 {
		settleIn(t, st, m, false)
	}
	n, err := relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	time.Sleep(redeliverAfter)
	relay.Redeliver(ctx)
	require.Zero(t, value(t, metrics.republished), "the stream holds them ahead of the consumer")
	require.Equal(t, uint64(3), b.streamMsgs(t))

	// The stream loses them: nothing is pending for the consumer any more, all are due.
	s, err := b.js.Stream(ctx, StreamName)
	require.NoError(t, err)
	require.NoError(t, s.Purge(ctx))
	relay.Redeliver(ctx)
	require.Equal(t, 3.0, value(t, metrics.republished))
	require.Equal(t, uint64(3), b.streamMsgs(t))
}

// A stream purge loses a payment's only event, but the broker still remembers its message id for
// DuplicateWindow (a purge keeps the duplicate map): a re-publication under that id would be
// dropped as a copy of what the broker no longer holds, and nothing would bring the event. It is
// published again under a message id of its own, within the window, and delivered once.
func TestPurgedLastEventIsDelivered(t *testing.T) {
	ctx := context.Background()
	st, b := ownStore(t), newBroker(t)
	h := newHook(t, answer(http.StatusNoContent))
	settleIn(t, st, newMerchantIn(t, st, h.URL), false) // payment.succeeded only

	redeliverAfter := 500 * time.Millisecond
	require.Less(t, 4*redeliverAfter, DuplicateWindow)
	metrics := NewMetrics(prometheus.NewRegistry())
	relay := NewRelay(RelayOptions{Store: st, JetStream: b.js, RedeliverAfter: redeliverAfter, Metrics: metrics, Logger: quiet})
	n, err := relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	s, err := b.js.Stream(ctx, StreamName)
	require.NoError(t, err)
	require.NoError(t, s.Purge(ctx))

	testkit.RunUntilEnd(t,
		relay,
		NewWebhookConsumer(WebhookConsumerOptions{Store: st, JetStream: b.js, Metrics: metrics, Logger: quiet}),
		NewWebhookSender(WebhookSenderOptions{Store: st, AllowPrivate: true, Metrics: metrics, Logger: quiet}))
	require.Eventually(t, func() bool { return h.Count() == 1 }, 30*time.Second, 20*time.Millisecond, "the lost event delivered")
	time.Sleep(4 * redeliverAfter)
	require.Equal(t, 1, h.Count(), "once")
	require.GreaterOrEqual(t, value(t, metrics.republished), 1.0)
}

// A broker that lost the webhook consumer but kept the stream (its consumer state lost, or the
// consumer deleted by hand) gets it back reading from where the inbox is known complete, not from
// the stream's start: a week of events read again would hold every new webhook behind them. The
// point is the database's time and the stream's messages carry the broker's: a database clock
// ahead must not make the consumer skip the events just after the point, nor one behind read
// the events before it again.
func TestLostConsumerResumesWhereTheInboxIsComplete(t *testing.T) {
	for _, tc := range []struct {
		name string
		skew time.Duration // the database's clock minus the broker's
	}{
		{"one clock", 0},
		{"database ahead of the broker", 10 * time.Minute},
		{"database behind the broker", -10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) { lostConsumerResumes(t, tc.skew) })
	}
}

// skewedClock is a store whose database clock runs skew ahead of this host's (the broker's).
type skewedClock struct {
	*store.Store
	skew time.Duration
}

func (s skewedClock) ConfirmedAt(ctx context.Context, consumer string) (at, now time.Time, ok bool, err error) {
	at, now, ok, err = s.Store.ConfirmedAt(ctx, consumer)
	return at.Add(s.skew), now.Add(s.skew), ok, err
}

func lostConsumerResumes(t *testing.T, skew time.Duration) {
	ctx := context.Background()
	st, b := ownStore(t), newBroker(t)
	m := newMerchantIn(t, st, "") // deliveries skipped: only the inbox matters here
	redeliverAfter := 200 * time.Millisecond
	relay := NewRelay(RelayOptions{Store: st, JetStream: b.js, RedeliverAfter: redeliverAfter, Logger: quiet})
	relay.Redeliver(ctx) // the confirmed point starts here
	// Two batches: the confirmed point ends at the second one's publication, which the broker
	// stored just after it (that one is read again).
	const old = 21
	for range old - 1 {
		settleIn(t, st, m, false)
	}
	n, err := relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, old-1, n)
	settleIn(t, st, m, false)
	n, err = relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	consume := func(st ConsumerStore, metrics *Metrics) func() {
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = NewWebhookConsumer(WebhookConsumerOptions{Store: st, JetStream: b.js, Metrics: metrics, Logger: quiet}).Run(cctx)
		}()
		return func() { cancel(); <-done }
	}
	first := NewMetrics(prometheus.NewRegistry())
	stop := consume(st, first)
	require.Eventually(t, func() bool { return value(t, first.consumed.WithLabelValues("skipped")) == old }, 20*time.Second, 20*time.Millisecond)
	stop()
	time.Sleep(redeliverAfter)
	relay.Redeliver(ctx) // the point moves over the events the inbox holds

	require.NoError(t, b.js.DeleteConsumer(ctx, StreamName, WebhooksConsumer))
	settleIn(t, st, m, false)
	n, err = relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	again := NewMetrics(prometheus.NewRegistry())
	stop = consume(skewedClock{st, skew}, again)
	defer stop()
	require.Eventually(t, func() bool { return value(t, again.consumed.WithLabelValues("skipped")) == 1 }, 20*time.Second, 20*time.Millisecond, "the new event")
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, 1.0, value(t, again.consumed.WithLabelValues("duplicate")), "only the last batch the inbox held was read again")
}

// An operator who pauses the webhook consumer on the broker (`nats consumer pause`, say during an
// incident at the merchants' side) keeps it paused: the consumer, whose pulls end and start
// again every few seconds, does not undo the pause when it checks its consumer is still there.
func TestOperatorsPauseOfTheWebhookConsumerIsKept(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t)
	testkit.RunUntilEnd(t, NewWebhookConsumer(WebhookConsumerOptions{Store: db, JetStream: b.js, Logger: quiet}))
	require.Eventually(t, func() bool {
		_, err := b.js.Consumer(ctx, StreamName, WebhooksConsumer)
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	_, err := b.js.PauseConsumer(ctx, StreamName, WebhooksConsumer, until)
	require.NoError(t, err)

	time.Sleep(3 * pullExpiry) // several pulls ended and started again
	c, err := b.js.Consumer(ctx, StreamName, WebhooksConsumer)
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	require.True(t, info.Paused, "still paused")
	require.NotNil(t, info.Config.PauseUntil)
	require.True(t, until.Equal(*info.Config.PauseUntil), "until %s", info.Config.PauseUntil)
}
