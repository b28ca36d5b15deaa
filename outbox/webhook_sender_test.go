package outbox

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/store"
)

// newDelivery settles a payment of the merchant and records its event as a pending delivery, as
// the webhook consumer does, without a broker: the test then claims and sends it by hand.
func newDelivery(t *testing.T, st *store.Store, merchantURL string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	pid := settleIn(t, st, newMerchantIn(t, st, merchantURL), false)
	var ev *store.OutboxEvent
	_, _, err := st.RelayOutbox(ctx, 10_000, func(_ context.Context, evs []store.OutboxEvent) ([]uuid.UUID, error) {
		for _, e := range evs {
			if e.AggregateID == pid {
				ev = &e
			}
		}
		return nil, nil
	})
	require.NoError(t, err)
	require.NotNil(t, ev)
	body, err := WebhookBody(Event{ID: ev.ID, Type: ev.Type, AggregateID: ev.AggregateID, CreatedAt: ev.CreatedAt, Data: ev.Payload})
	require.NoError(t, err)
	accs, err := st.AcceptEvents(ctx, WebhooksConsumer, []store.NewDelivery{{EventID: ev.ID, AggregateID: pid, Type: ev.Type,
		CreatedAt: ev.CreatedAt, Body: body}})
	require.NoError(t, err)
	require.Equal(t, []store.Acceptance{store.AcceptedPending}, accs)
	return ev.ID
}

// claimDue claims the test's only delivery once it is due, under lease.
func claimDue(t *testing.T, st *store.Store, lease time.Duration) store.ClaimedDelivery {
	t.Helper()
	var ds []store.ClaimedDelivery
	require.Eventually(t, func() bool {
		var err error
		ds, err = st.ClaimDeliveries(context.Background(), 10, 4, lease)
		require.NoError(t, err)
		return len(ds) > 0
	}, 10*time.Second, 5*time.Millisecond, "the delivery comes due")
	require.Len(t, ds, 1)
	return ds[0]
}

// A redelivery starts the retry schedule again: when its send fails, the next attempt is one
// first backoff step away, not the step of the delivery's whole attempt count (up to an hour),
// whatever the delivery's state before. The attempts before it stay in its log.
func TestRedeliveryStartsTheRetrySchedule(t *testing.T) {
	const before = 8 // failed attempts before the last one ahead of the redelivery
	for _, tc := range []struct {
		name   string
		last   int  // the merchant's answer to the last attempt before the redelivery
		giveUp bool // the last failure ends the retry window
		want   store.DeliveryStatus
	}{
		{name: "given up", last: http.StatusBadGateway, giveUp: true, want: store.DeliveryFailed},
		{name: "delivered", last: http.StatusNoContent, want: store.DeliveryDelivered},
		{name: "backing off", last: http.StatusBadGateway, want: store.DeliveryPending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			st := ownStore(t)
			var mu sync.Mutex
			status := http.StatusServiceUnavailable
			h := newHook(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				w.WriteHeader(status)
			})
			id := newDelivery(t, st, h.URL)
			sender := func(base, retryFor time.Duration) *WebhookSender {
				return NewWebhookSender(WebhookSenderOptions{Store: st, AllowPrivate: true, BackoffBase: base, BackoffMax: time.Hour,
					RetryFor: retryFor, Logger: quiet})
			}
			fast, slow := sender(time.Millisecond, time.Hour), sender(10*time.Second, 72*time.Hour)
			for range before {
				fast.Send(ctx, claimDue(t, st, time.Minute))
			}
			mu.Lock()
			status = tc.last
			mu.Unlock()
			last := slow
			if tc.giveUp {
				last = sender(10*time.Second, time.Millisecond)
			}
			last.Send(ctx, claimDue(t, st, time.Minute))
			d, err := st.Delivery(ctx, id)
			require.NoError(t, err)
			require.Equal(t, tc.want, d.Status)
			require.Equal(t, before+1, d.AttemptCount)

			mu.Lock()
			status = http.StatusServiceUnavailable
			mu.Unlock()
			_, err = st.Redeliver(ctx, id)
			require.NoError(t, err)
			c := claimDue(t, st, time.Minute)
			require.Equal(t, before+2, c.Attempt, "the attempt count goes on")
			sent := time.Now()
			slow.Send(ctx, c)

			d, err = st.Delivery(ctx, id)
			require.NoError(t, err)
			require.Equal(t, store.DeliveryPending, d.Status)
			require.Equal(t, before+2, d.AttemptCount)
			require.Len(t, d.Attempts, before+2, "the attempts before the redelivery stay in the log")
			wait := d.NextAttemptAt.Sub(sent)
			require.GreaterOrEqual(t, wait, 4*time.Second, "half of the first step at least")
			require.LessOrEqual(t, wait, 11*time.Second, "the first step of the schedule, not attempt %d's", c.Attempt)
		})
	}
}

// A send whose sender stalls past its lease (a paused process) while another sender takes the
// delivery over reports late: its result is logged, but the delivery's state is the other
// attempt's. Only a 2xx, which says the merchant has the event, marks it delivered whoever holds
// it (the later attempt's result is then the one dropped).
func TestStalledSendDoesNotOverwriteTheTakeover(t *testing.T) {
	const lease = 300 * time.Millisecond
	for _, tc := range []struct {
		name            string
		stalled, second int  // the merchant's answers to the stalled attempt and to the takeover
		secondHangs     bool // the takeover is still in flight when the stalled attempt reports
		redeliver       bool // an operator redelivers after the takeover, before the stalled attempt reports
		want            store.DeliveryStatus
		wantCode        int // last_status_code
		wantClaimed     bool
	}{
		{name: "failure after a delivery", stalled: 503, second: 204, want: store.DeliveryDelivered, wantCode: 204},
		{name: "2xx after a delivery", stalled: 200, second: 204, want: store.DeliveryDelivered, wantCode: 204},
		{name: "failure after a failure", stalled: 503, second: 502, want: store.DeliveryPending, wantCode: 502},
		{name: "failure during the takeover", stalled: 503, second: 204, secondHangs: true, want: store.DeliveryPending, wantClaimed: true},
		{name: "2xx after a failure", stalled: 200, second: 502, want: store.DeliveryDelivered, wantCode: 200},
		{name: "2xx after a redelivery", stalled: 200, second: 204, redeliver: true, want: store.DeliveryPending, wantCode: 204},
		{name: "failure after a redelivery", stalled: 503, second: 204, redeliver: true, want: store.DeliveryPending, wantCode: 204},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			st := ownStore(t)
			resume, release := make(chan struct{}), make(chan struct{})
			var resumeOnce, releaseOnce sync.Once
			open := func() { resumeOnce.Do(func() { close(resume) }) }
			free := func() { releaseOnce.Do(func() { close(release) }) }
			h := newHook(t, func(n int, w http.ResponseWriter, r *http.Request) {
				switch n {
				case 1:
					<-resume
					w.WriteHeader(tc.stalled)
				default:
					if tc.secondHangs {
						select {
						case <-release:
						case <-r.Context().Done():
						}
					}
					w.WriteHeader(tc.second)
				}
			})
			t.Cleanup(func() { open(); free() }) // before the endpoint closes: it waits for its requests
			id := newDelivery(t, st, h.URL)
			sender := NewWebhookSender(WebhookSenderOptions{Store: st, AllowPrivate: true, BackoffBase: 10 * time.Second, Logger: quiet})

			first := claimDue(t, st, lease)
			stalled := make(chan struct{})
			go func() {
				defer close(stalled)
				sender.Send(ctx, first)
			}()
			require.Eventually(t, func() bool { return h.Count() == 1 }, 5*time.Second, 5*time.Millisecond)
			second := claimDue(t, st, time.Minute) // once the stalled attempt's lease ran out
			require.Equal(t, first.ID, second.ID)
			require.Equal(t, 2, second.Attempt)
			taken := make(chan struct{})
			go func() {
				defer close(taken)
				sender.Send(ctx, second)
			}()
			require.Eventually(t, func() bool { return h.Count() == 2 }, 5*time.Second, 5*time.Millisecond)
			if !tc.secondHangs {
				<-taken
			}
			if tc.redeliver {
				_, err := st.Redeliver(ctx, id)
				require.NoError(t, err)
			}
			after, err := st.Delivery(ctx, id)
			require.NoError(t, err)

			open()
			<-stalled
			d, err := st.Delivery(ctx, id)
			require.NoError(t, err)
			require.Equal(t, tc.want, d.Status)
			require.Equal(t, 2, d.AttemptCount, "the late result counts no attempt")
			require.Equal(t, tc.wantCode, d.LastStatusCode)
			require.Equal(t, tc.wantClaimed, d.ClaimedUntil != nil, "the takeover's lease")
			logged := 2
			if tc.secondHangs {
				logged = 1 // the takeover's when it ends
			}
			require.Len(t, d.Attempts, logged, "the late attempt is logged")
			if tc.want == after.Status {
				// Nothing of the late result in the delivery: not its schedule, not its error.
				require.Equal(t, after.NextAttemptAt, d.NextAttemptAt)
				require.Equal(t, after.LastError, d.LastError)
				require.Equal(t, after.DeliveredAt, d.DeliveredAt)
				require.Equal(t, after.UpdatedAt, d.UpdatedAt)
			}
			free()
			<-taken
			if tc.secondHangs {
				d, err := st.Delivery(ctx, id)
				require.NoError(t, err)
				require.Equal(t, store.DeliveryDelivered, d.Status, "the takeover's result is recorded")
				require.Len(t, d.Attempts, 2)
			}
		})
	}
}

// A 2xx status line is the merchant's acknowledgement, however its body ends: a body that stalls
// (an endpoint that never closes the connection) or breaks off still marks the delivery
// delivered, within the attempt's timeout, and the merchant gets the event once. Any other status
// stays a failed attempt, whatever its body does.
func TestAcknowledgedWhateverTheBodyDoes(t *testing.T) {
	const timeout = 500 * time.Millisecond
	stall := func(status int) func(int, http.ResponseWriter, *http.Request) {
		return func(_ int, w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(status)
			_, _ = w.Write([]byte("ok"))
			w.(http.Flusher).Flush()
			<-r.Context().Done() // the body never ends
		}
	}
	cut := func(status int) func(int, http.ResponseWriter, *http.Request) {
		return func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(status)
			_, _ = w.Write([]byte("ok")) // 2 of the 100 bytes promised, then the connection closes
		}
	}
	for _, tc := range []struct {
		name    string
		respond func(int, http.ResponseWriter, *http.Request)
		want    store.DeliveryStatus
		result  string // the attempt's metric
	}{
		{name: "2xx, body stalls", respond: stall(http.StatusOK), want: store.DeliveryDelivered, result: "2xx"},
		{name: "2xx, body cut off", respond: cut(http.StatusAccepted), want: store.DeliveryDelivered, result: "2xx"},
		{name: "5xx, body stalls", respond: stall(http.StatusServiceUnavailable), want: store.DeliveryPending, result: "non_2xx"},
		{name: "5xx, body cut off", respond: cut(http.StatusBadGateway), want: store.DeliveryPending, result: "non_2xx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			st := ownStore(t)
			h := newHook(t, tc.respond)
			id := newDelivery(t, st, h.URL)
			m := unregistered()
			sender := NewWebhookSender(WebhookSenderOptions{Store: st, AllowPrivate: true, Timeout: timeout, BackoffBase: time.Hour,
				Metrics: m, Logger: quiet})

			start := time.Now()
			sender.Send(ctx, claimDue(t, st, time.Minute))
			require.Less(t, time.Since(start), timeout+5*time.Second, "the attempt ends with its timeout")

			d, err := st.Delivery(ctx, id)
			require.NoError(t, err)
			require.Equal(t, tc.want, d.Status, "last error %q", d.LastError)
			require.Equal(t, 1, d.AttemptCount)
			require.Len(t, d.Attempts, 1)
			require.Equal(t, 1, h.Count())
			require.Equal(t, 1.0, value(t, m.attempts.WithLabelValues(tc.result)))
			if tc.want == store.DeliveryDelivered {
				require.NotNil(t, d.DeliveredAt)
				require.Empty(t, d.LastError)
				require.Equal(t, 1.0, value(t, m.deliveries.WithLabelValues("delivered")))
				_, err := st.ClaimDeliveries(ctx, 10, 4, time.Minute)
				require.NoError(t, err)
				require.Equal(t, 1, h.Count(), "the merchant gets the event once")
			}
		})
	}
}
