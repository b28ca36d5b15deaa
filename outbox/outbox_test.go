package outbox

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// The integration tests share one database and do not run in parallel: a relay or a sender
// works on every row of it. Each test has its own embedded broker and merchant endpoints, and
// asserts on its own merchants' rows.

var (
	db  *store.Store
	env *testkit.Env
)

func TestMain(m *testing.M) {
	testkit.Main(m, testkit.Options{}, func(e *testkit.Env) { db, env = e.Store, e })
}

// ownStore is a store on a migrated database of the test's own: a pipeline on it sees only the
// test's events, for tests that count what the whole pipeline did (its metrics).
func ownStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), store.Options{URL: env.OwnDatabase(t), SecretKey: testkit.SecretKey, Migrate: true, MaxConns: 8})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	return st
}

var quiet = slog.New(slog.DiscardHandler)

func answer(status int) func(int, http.ResponseWriter, *http.Request) {
	return func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }
}

// hang never answers until the client gives up.
func hang(_ int, _ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }

// newHook is a merchant endpoint that records every request.
func newHook(t *testing.T, respond func(n int, w http.ResponseWriter, r *http.Request)) *testkit.Hook {
	t.Helper()
	return testkit.NewHook(t, testkit.HookOptions{EventIDHeader: HeaderEventID, SignatureHeader: HeaderSignature, Respond: respond})
}

type broker struct {
	js jetstream.JetStream
}

func newBroker(t *testing.T) *broker {
	t.Helper()
	url, stop, err := StartEmbedded(t.TempDir())
	require.NoError(t, err)
	nc, js, err := Connect(url, "outbox-test", BrokerAuth{})
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close(); stop() })
	_, err = EnsureStream(context.Background(), js)
	require.NoError(t, err)
	return &broker{js: js}
}

func (b *broker) streamMsgs(t *testing.T) uint64 {
	t.Helper()
	s, err := b.js.Stream(context.Background(), StreamName)
	require.NoError(t, err)
	info, err := s.Info(context.Background())
	require.NoError(t, err)
	return info.State.Msgs
}

// consumerIdle: every message was handed out and acked, none redelivered.
func (b *broker) consumerIdle(t *testing.T) bool {
	t.Helper()
	c, err := b.js.Consumer(context.Background(), StreamName, WebhooksConsumer)
	if err != nil {
		return false
	}
	info, err := c.Info(context.Background())
	require.NoError(t, err)
	return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0
}

type pipelineOptions struct {
	relays    int // relays to run (0: none; tests drive the relay themselves)
	consumers int // webhook consumers sharing the durable consumer (0: one)
	// redeliverAfter is the relays' RedeliverAfter; zero: an hour, so that a test's relays do
	// not publish again the events earlier tests left outside the inbox (the database is shared).
	redeliverAfter time.Duration
	sender         WebhookSenderOptions
	// refusePrivate keeps the sender's default address policy; otherwise it may call the test's
	// endpoints on 127.0.0.1.
	refusePrivate bool
	// store is the pipeline's; nil: the package's shared database.
	store *store.Store
}

type pipeline struct {
	metrics *Metrics
	relay   *Relay // for tests that relay by hand
}

// startPipeline runs relays, the webhook consumer and the sender against b until the test ends.
func startPipeline(t *testing.T, b *broker, o pipelineOptions) *pipeline {
	t.Helper()
	p := &pipeline{metrics: NewMetrics(prometheus.NewRegistry())}
	db := db
	if o.store != nil {
		db = o.store
	}
	p.relay = NewRelay(RelayOptions{Store: db, JetStream: b.js, PollInterval: 20 * time.Millisecond, Metrics: p.metrics, Logger: quiet})
	so := o.sender
	so.Store, so.Metrics = db, p.metrics
	if so.Logger == nil {
		so.Logger = quiet
	}
	so.AllowPrivate = !o.refusePrivate
	if so.PollInterval == 0 {
		so.PollInterval = 20 * time.Millisecond
	}
	if so.BackoffBase == 0 {
		so.BackoffBase, so.BackoffMax = 50*time.Millisecond, 200*time.Millisecond
	}
	runners := []testkit.Runner{NewWebhookSender(so)}
	for range max(o.consumers, 1) {
		runners = append(runners, NewWebhookConsumer(WebhookConsumerOptions{Store: db, JetStream: b.js, RetryDelay: 100 * time.Millisecond, Metrics: p.metrics, Logger: quiet}))
	}
	if o.redeliverAfter == 0 {
		o.redeliverAfter = time.Hour
	}
	for range o.relays {
		runners = append(runners, NewRelay(RelayOptions{Store: db, JetStream: b.js, PollInterval: 20 * time.Millisecond,
			RedeliverAfter: o.redeliverAfter, Metrics: p.metrics, Logger: quiet}))
	}
	testkit.RunUntilEnd(t, runners...)
	return p
}

func newMerchant(t *testing.T, url string) testkit.Merchant {
	t.Helper()
	return newMerchantIn(t, db, url)
}

func newMerchantIn(t *testing.T, st *store.Store, url string) testkit.Merchant {
	t.Helper()
	return testkit.NewMerchant(t, st, testkit.MerchantOptions{WebhookURL: url, Deposit: 10_000_000})
}

// settle takes a payment through the store to succeeded (through unknown first when asked).
func settle(t *testing.T, m testkit.Merchant, viaUnknown bool) uuid.UUID {
	t.Helper()
	return settleIn(t, db, m, viaUnknown)
}

func settleIn(t *testing.T, st *store.Store, m testkit.Merchant, viaUnknown bool) uuid.UUID {
	t.Helper()
	id, err := testkit.Settle(context.Background(), st, m, viaUnknown)
	require.NoError(t, err)
	return id
}

// peek returns the first unpublished event of a payment without marking anything.
func peek(t *testing.T, paymentID uuid.UUID) store.OutboxEvent {
	t.Helper()
	var found *store.OutboxEvent
	_, _, err := db.RelayOutbox(context.Background(), 10_000, func(_ context.Context, evs []store.OutboxEvent) ([]uuid.UUID, error) {
		for _, e := range evs {
			if e.AggregateID == paymentID {
				found = &e
			}
		}
		return nil, nil
	})
	require.NoError(t, err)
	require.NotNil(t, found)
	return *found
}

func requireBacklogEmpty(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		n, _, err := db.OutboxBacklog(context.Background())
		return err == nil && n == 0
	}, 20*time.Second, 20*time.Millisecond, "the outbox backlog drains")
}

// 1. The same message published ten times with the broker's de-duplication, then ten times
// with it bypassed (a new Nats-Msg-Id each time, same event id in the body): one delivery.
func TestDuplicatePublishesDeliverOnce(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t)
	h := newHook(t, answer(http.StatusNoContent))
	m := newMerchant(t, h.URL)
	pid := settle(t, m, false)
	ev := peek(t, pid)

	for i := range 10 {
		msg, err := message(ev)
		require.NoError(t, err)
		ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(ev.ID.String()))
		require.NoError(t, err)
		require.Equal(t, i > 0, ack.Duplicate, "the broker drops repeats of a message id")
	}
	for range 10 {
		msg, err := message(ev)
		require.NoError(t, err)
		ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(uuid.NewString()))
		require.NoError(t, err)
		require.False(t, ack.Duplicate)
	}
	require.Equal(t, uint64(11), b.streamMsgs(t))

	p := startPipeline(t, b, pipelineOptions{})
	require.Eventually(t, func() bool { return b.consumerIdle(t) && h.Count() == 1 }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, 1, h.Count(), "exactly one webhook")
	require.Equal(t, ev.ID.String(), h.Requests()[0].EventID)
	require.Equal(t, 10.0, value(t, p.metrics.consumed.WithLabelValues("duplicate")), "the inbox absorbed the ten copies")

	ds, err := db.PaymentDeliveries(ctx, pid)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, store.DeliveryDelivered, ds[0].Status)
	require.Equal(t, 1, ds[0].AttemptCount)
	require.Len(t, ds[0].Attempts, 1)
	require.Equal(t, 204, ds[0].Attempts[0].StatusCode)

	// The relay publishes the row for real now: a duplicate for the broker, marked all the same.
	_, err = p.relay.RelayOnce(ctx)
	require.NoError(t, err)
	requireBacklogEmpty(t)
	require.Equal(t, uint64(11), b.streamMsgs(t))
}

var errKilled = errors.New("relay killed")

// 2. A relay dies after the broker acknowledged its batch and before it marked it: the next
// relay publishes the rows again, the broker drops the copies, nothing is lost or doubled.
func TestRelayKilledBeforeMarkingIsDeduplicated(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t)
	h := newHook(t, answer(http.StatusOK))
	m := newMerchant(t, h.URL)
	p := startPipeline(t, b, pipelineOptions{})
	var pids []uuid.UUID
	for range 3 {
		pids = append(pids, settle(t, m, false))
	}

	claimed, published, err := db.RelayOutbox(ctx, 1000, func(ctx context.Context, evs []store.OutboxEvent) ([]uuid.UUID, error) {
		acked, _, err := p.relay.publish(ctx, evs, nil)
		require.NoError(t, err)
		require.Len(t, acked, len(evs))
		return nil, errKilled // dies before marking
	})
	require.ErrorIs(t, err, errKilled)
	require.Zero(t, published)
	require.GreaterOrEqual(t, claimed, 3)
	backlog, _, err := db.OutboxBacklog(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(claimed), backlog, "nothing was marked")
	inStream := b.streamMsgs(t)

	require.Eventually(t, func() bool { return h.Count() == 3 }, 10*time.Second, 20*time.Millisecond, "the published copies are delivered")

	again, err := p.relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, claimed, again, "the restarted relay republishes every unmarked row")
	requireBacklogEmpty(t)
	require.Equal(t, inStream, b.streamMsgs(t), "the broker de-duplicated the republished messages")
	require.Eventually(t, func() bool { return b.consumerIdle(t) }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, 3, h.Count(), "nothing delivered twice")
	for _, pid := range pids {
		ds, err := db.PaymentDeliveries(ctx, pid)
		require.NoError(t, err)
		require.Len(t, ds, 1)
		require.Equal(t, store.DeliveryDelivered, ds[0].Status)
	}
}

// 3. An endpoint answering 500, 500, 200 gets the event on the third attempt with the same id
// and a valid signature each time; an endpoint that never answers delays nobody else.
func TestRetriesUntilDeliveredAndAHangingMerchantDelaysNobody(t *testing.T) {
	ctx := context.Background()
	// A database of its own: the pipeline's metrics count this test's deliveries alone.
	db := ownStore(t)
	b := newBroker(t)
	flaky := newHook(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= 2 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	stuck := newHook(t, hang)
	fast := newHook(t, answer(http.StatusOK))
	mFlaky, mStuck, mFast := newMerchantIn(t, db, flaky.URL), newMerchantIn(t, db, stuck.URL), newMerchantIn(t, db, fast.URL)

	const timeout = 4 * time.Second
	p := startPipeline(t, b, pipelineOptions{relays: 1, sender: WebhookSenderOptions{Timeout: timeout, Concurrency: 8, PerMerchant: 2}, store: db})
	var stuckPayments []uuid.UUID
	for range 6 { // older than the others: first in line
		stuckPayments = append(stuckPayments, settleIn(t, db, mStuck, false))
	}
	require.Eventually(t, func() bool { return stuck.Count() == 2 }, 5*time.Second, 10*time.Millisecond, "the hanging merchant gets its two slots")
	start := time.Now()
	flakyPayment := settleIn(t, db, mFlaky, false)
	for range 5 {
		settleIn(t, db, mFast, false)
	}
	require.Eventually(t, func() bool { return flaky.Count() == 3 && fast.Count() == 5 }, timeout, 10*time.Millisecond)
	require.Less(t, time.Since(start), timeout, "delivered before a single attempt at the hanging endpoint timed out")
	require.Equal(t, 2, stuck.Count(), "the hanging merchant never holds more than its share")

	reqs := flaky.Requests()
	for _, r := range reqs {
		require.Equal(t, reqs[0].EventID, r.EventID, "the same event id on every attempt")
		require.Equal(t, reqs[0].Body, r.Body, "the same body on every attempt")
		require.Equal(t, "application/json", r.ContentType)
		require.NoError(t, Verify(mFlaky.WebhookSecret, r.Signature, r.Body, 5*time.Minute))
		require.ErrorIs(t, Verify(mFast.WebhookSecret, r.Signature, r.Body, 5*time.Minute), ErrSignatureMismatch)
	}
	w := testkit.DecodeWebhook(t, reqs[0].Body)
	require.Equal(t, reqs[0].EventID, w.ID)
	require.Equal(t, "payment.succeeded", w.Type)
	require.Equal(t, flakyPayment.String(), w.Data.ID)
	require.Equal(t, payment.StatusSucceeded, w.Data.Status)
	require.Equal(t, "1.00", w.Data.Amount)

	require.Eventually(t, func() bool {
		ds, err := db.PaymentDeliveries(ctx, flakyPayment)
		return err == nil && len(ds) == 1 && ds[0].Status == store.DeliveryDelivered
	}, 2*time.Second, 10*time.Millisecond)
	ds, err := db.PaymentDeliveries(ctx, flakyPayment)
	require.NoError(t, err)
	require.Equal(t, 3, ds[0].AttemptCount)
	require.Len(t, ds[0].Attempts, 3)
	for i, code := range []int{500, 500, 200} {
		require.Equal(t, code, ds[0].Attempts[i].StatusCode)
		require.Equal(t, i+1, ds[0].Attempts[i].Attempt)
	}
	require.Equal(t, "HTTP 500", ds[0].Attempts[0].Error)
	require.True(t, ds[0].Attempts[1].StartedAt.After(ds[0].Attempts[0].StartedAt))

	// The hanging endpoint's attempts time out and are retried later, logged as such.
	require.Eventually(t, func() bool {
		ds, err := db.PaymentDeliveries(ctx, stuckPayments[0])
		return err == nil && len(ds) == 1 && len(ds[0].Attempts) >= 1
	}, timeout+5*time.Second, 50*time.Millisecond)
	ds, err = db.PaymentDeliveries(ctx, stuckPayments[0])
	require.NoError(t, err)
	require.Equal(t, store.DeliveryPending, ds[0].Status)
	require.Zero(t, ds[0].Attempts[0].StatusCode)
	require.Contains(t, ds[0].Attempts[0].Error, "no answer within")
	require.GreaterOrEqual(t, ds[0].Attempts[0].Duration, timeout-100*time.Millisecond)
	require.GreaterOrEqual(t, value(t, p.metrics.attempts.WithLabelValues("timeout")), 1.0)
	require.Equal(t, 2.0, value(t, p.metrics.attempts.WithLabelValues("non_2xx")))
	require.Equal(t, 6.0, value(t, p.metrics.deliveries.WithLabelValues("delivered")))
}

// A merchant without a webhook URL: the event is recorded as skipped, nothing is sent.
func TestMerchantWithoutWebhookURLIsSkipped(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t)
	m := newMerchant(t, "")
	p := startPipeline(t, b, pipelineOptions{relays: 1})
	pid := settle(t, m, false)
	require.Eventually(t, func() bool {
		ds, err := db.PaymentDeliveries(ctx, pid)
		return err == nil && len(ds) == 1 && ds[0].Status == store.DeliverySkipped
	}, 10*time.Second, 20*time.Millisecond)
	ds, err := db.MerchantDeliveries(ctx, m.ID, 10)
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Empty(t, ds[0].Attempts)
	require.GreaterOrEqual(t, value(t, p.metrics.deliveries.WithLabelValues("skipped")), 1.0)
}

// countingStore counts the consumer's transactions and their sizes.
type countingStore struct {
	ConsumerStore
	mu          sync.Mutex
	calls, most int
}

func (c *countingStore) AcceptEvents(ctx context.Context, consumer string, es []store.NewDelivery) ([]store.Acceptance, error) {
	c.mu.Lock()
	c.calls, c.most = c.calls+1, max(c.most, len(es))
	c.mu.Unlock()
	return c.ConsumerStore.AcceptEvents(ctx, consumer, es)
}

// A backlog is taken in batches (one transaction each, at most Batch events), each event once.
func TestConsumerTakesABacklogInBatches(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t)
	m := newMerchant(t, "")
	const n, batch = 100, 16
	var pids []uuid.UUID
	for range n {
		pids = append(pids, settle(t, m, false))
	}
	relay := NewRelay(RelayOptions{Store: db, JetStream: b.js, Metrics: NewMetrics(prometheus.NewRegistry()), Logger: quiet})
	for {
		claimed, err := relay.RelayOnce(ctx)
		require.NoError(t, err)
		if claimed == 0 {
			break
		}
	}

	cs := &countingStore{ConsumerStore: db}
	cctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = NewWebhookConsumer(WebhookConsumerOptions{Store: cs, JetStream: b.js, Batch: batch, Metrics: NewMetrics(prometheus.NewRegistry()), Logger: quiet}).Run(cctx)
	}()
	t.Cleanup(func() { cancel(); <-stopped })
	// The effect itself first: once, in CI, the consumer read as idle while an event still had
	// no delivery. Idle is then checked for the counts below.
	require.Eventually(t, func() bool {
		for _, pid := range pids {
			if ds, err := db.PaymentDeliveries(ctx, pid); err != nil || len(ds) == 0 {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond, "every event recorded")
	require.Eventually(t, func() bool { return b.consumerIdle(t) }, 20*time.Second, 20*time.Millisecond)

	for _, pid := range pids {
		ds, err := db.PaymentDeliveries(ctx, pid)
		require.NoError(t, err)
		require.Len(t, ds, 1)
		require.Equal(t, store.DeliverySkipped, ds[0].Status)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	require.LessOrEqual(t, cs.most, batch)
	require.Greater(t, cs.most, 1, "events waiting together are recorded together")
	require.Less(t, cs.calls, n/2, "%d transactions for %d events", cs.calls, n)
	t.Logf("%d events in %d transactions, at most %d in one", n, cs.calls, cs.most)
}

// Retries stop once the retry window is over; an operator's redelivery sends the same event.
func TestGivesUpAfterTheRetryWindowThenRedelivers(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t)
	var healthy sync.Mutex
	status := http.StatusBadGateway
	h := newHook(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		healthy.Lock()
		defer healthy.Unlock()
		w.WriteHeader(status)
	})
	m := newMerchant(t, h.URL)
	p := startPipeline(t, b, pipelineOptions{relays: 1, sender: WebhookSenderOptions{RetryFor: 300 * time.Millisecond}})
	pid := settle(t, m, false)
	require.Eventually(t, func() bool {
		ds, err := db.PaymentDeliveries(ctx, pid)
		return err == nil && len(ds) == 1 && ds[0].Status == store.DeliveryFailed
	}, 10*time.Second, 20*time.Millisecond)
	ds, err := db.PaymentDeliveries(ctx, pid)
	require.NoError(t, err)
	tries := h.Count()
	require.Greater(t, tries, 1)
	require.Len(t, ds[0].Attempts, tries)
	require.Equal(t, 502, ds[0].LastStatusCode)
	require.GreaterOrEqual(t, value(t, p.metrics.deliveries.WithLabelValues("failed")), 1.0)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, tries, h.Count(), "no attempt after giving up")

	healthy.Lock()
	status = http.StatusOK
	healthy.Unlock()
	_, err = db.Redeliver(ctx, ds[0].ID)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return h.Count() == tries+1 }, 5*time.Second, 10*time.Millisecond)
	reqs := h.Requests()
	require.Equal(t, reqs[0].EventID, reqs[tries].EventID)
	require.Equal(t, reqs[0].Body, reqs[tries].Body)
	require.NoError(t, Verify(m.WebhookSecret, reqs[tries].Signature, reqs[tries].Body, time.Minute))
	require.Eventually(t, func() bool {
		d, err := db.Delivery(ctx, ds[0].ID)
		return err == nil && d.Status == store.DeliveryDelivered
	}, 5*time.Second, 10*time.Millisecond)
}

// Two relays, two webhook consumers sharing the durable consumer, and payments that go
// processing -> unknown -> succeeded while everything runs: each payment's webhooks arrive once
// each, unknown before succeeded.
func TestPerPaymentOrderWithTwoRelays(t *testing.T) {
	b := newBroker(t)
	h := newHook(t, answer(http.StatusOK))
	m := newMerchant(t, h.URL)
	startPipeline(t, b, pipelineOptions{relays: 2, consumers: 2, sender: WebhookSenderOptions{PerMerchant: 8, Concurrency: 16}})
	const payments = 40
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range payments / 4 {
				settle(t, m, (g+i)%2 == 0)
			}
		}()
	}
	wg.Wait()
	want := payments + payments/2
	require.Eventually(t, func() bool { return h.Count() >= want }, 20*time.Second, 20*time.Millisecond)
	requireBacklogEmpty(t)
	time.Sleep(200 * time.Millisecond)
	reqs := h.Requests()
	require.Len(t, reqs, want)
	seen := map[string]bool{}
	order := map[string][]payment.Status{}
	for _, r := range reqs {
		require.False(t, seen[r.EventID], "event %s delivered twice", r.EventID)
		seen[r.EventID] = true
		require.NoError(t, Verify(m.WebhookSecret, r.Signature, r.Body, time.Minute))
		w := testkit.DecodeWebhook(t, r.Body)
		order[w.Data.ID] = append(order[w.Data.ID], w.Data.Status)
	}
	require.Len(t, order, payments)
	for id, statuses := range order {
		if len(statuses) == 2 {
			require.Equal(t, []payment.Status{payment.StatusUnknown, payment.StatusSucceeded}, statuses, "payment %s", id)
		} else {
			require.Equal(t, []payment.Status{payment.StatusSucceeded}, statuses, "payment %s", id)
		}
	}
}

// The relay's loop: retention and the backlog gauges.
func TestRelayRetentionAndGauges(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t)
	m := newMerchant(t, "")
	for range 3 {
		settle(t, m, false)
	}
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	r := NewRelay(RelayOptions{Store: db, JetStream: b.js, Metrics: metrics, Logger: quiet, Retention: time.Nanosecond, RetentionBatch: 2})
	r.observeBacklog(ctx)
	require.GreaterOrEqual(t, value(t, metrics.backlog), 3.0)
	require.Greater(t, value(t, metrics.oldestAge), 0.0)

	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	requireBacklogEmpty(t)
	require.Eventually(t, func() bool { return value(t, metrics.purged.WithLabelValues("outbox")) >= 3 }, 5*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return value(t, metrics.backlog) == 0 }, 5*time.Second, 20*time.Millisecond)
	require.GreaterOrEqual(t, value(t, metrics.published), 3.0)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the relay did not stop")
	}
	require.GreaterOrEqual(t, value(t, metrics.publishLatency), 3.0, "one latency sample per published row")
	families, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	require.True(t, names["kasa_relay_backlog"] && names["kasa_outbox_publish_latency_seconds"] && names["kasa_webhook_attempts_per_delivery"])
}

// value reads a counter or gauge, or a histogram's sample count.
func value(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	require.NoError(t, (<-ch).Write(&m))
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("unsupported metric %v", &m)
	return 0
}
