package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/outbox"
	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
	"github.com/kasa-pay/kasa/workflows"
)

// The event tests do not call t.Parallel: their relay publishes every outbox row of the shared
// database (other tests' merchants have no webhook URL: their events are recorded as skipped).

// newSink is a merchant's webhook endpoint recording every request.
func newSink(t *testing.T) *testkit.Hook {
	t.Helper()
	return testkit.NewHook(t, testkit.HookOptions{EventIDHeader: outbox.HeaderEventID, SignatureHeader: outbox.HeaderSignature})
}

// startEventPipeline runs an embedded broker, a relay, the webhook consumer and sender (as
// `kasa dev` does) until the test ends.
func startEventPipeline(t *testing.T) *prometheus.Registry {
	t.Helper()
	url, stopBroker, err := outbox.StartEmbedded(t.TempDir())
	require.NoError(t, err)
	nc, js, err := outbox.Connect(url, "events-test", outbox.BrokerAuth{})
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close(); stopBroker() }) // after the runners have stopped
	reg := prometheus.NewRegistry()
	metrics := outbox.NewMetrics(reg)
	quiet := slog.New(slog.DiscardHandler)
	runners := []testkit.Runner{
		outbox.NewRelay(outbox.RelayOptions{Store: db, JetStream: js, PollInterval: 20 * time.Millisecond, Metrics: metrics, Logger: quiet}),
		outbox.NewWebhookConsumer(outbox.WebhookConsumerOptions{Store: db, JetStream: js, Metrics: metrics, Logger: quiet}),
		outbox.NewWebhookSender(outbox.WebhookSenderOptions{Store: db, PollInterval: 20 * time.Millisecond, PerMerchant: 8, AllowPrivate: true,
			BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Metrics: metrics, Logger: quiet}),
	}
	testkit.RunUntilEnd(t, runners...)
	return reg
}

// newEventMerchant is a merchant made through the store, with a webhook URL and a funded account.
func newEventMerchant(t *testing.T, url string) testkit.Merchant {
	t.Helper()
	return testkit.NewMerchant(t, db, testkit.MerchantOptions{Name: "events", WebhookURL: url, Deposit: 100_000_000})
}

// 4. A burst of 1,000 outbox rows: the backlog drains, every event reaches its merchant once,
// and each payment's events arrive in order (unknown before succeeded).
func TestEventBurstDeliveredOnceInOrder(t *testing.T) {
	ctx := context.Background()
	sinks := []*testkit.Hook{newSink(t), newSink(t)}
	merchants := []testkit.Merchant{newEventMerchant(t, sinks[0].URL), newEventMerchant(t, sinks[1].URL)}
	reg := startEventPipeline(t)

	// 600 payments straight to succeeded and 200 through unknown: 1,000 events, produced by
	// eight writers while the pipeline runs.
	const direct, viaUnknown, writers = 600, 200, 8
	jobs := make(chan bool, direct+viaUnknown)
	for i := range direct + viaUnknown {
		jobs <- i%4 == 0 && i/4 < viaUnknown
	}
	close(jobs)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for unknown := range jobs {
				if _, err := testkit.Settle(ctx, db, merchants[w%2], unknown); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	require.Eventually(t, func() bool {
		n, _, err := db.OutboxBacklog(ctx)
		return err == nil && n == 0
	}, 60*time.Second, 50*time.Millisecond, "the backlog drains to zero")
	const events = direct + 2*viaUnknown
	require.Eventually(t, func() bool { return len(sinks[0].Requests())+len(sinks[1].Requests()) >= events },
		60*time.Second, 50*time.Millisecond, "every event is delivered")
	time.Sleep(300 * time.Millisecond)

	seen := map[string]bool{}
	statuses := map[string][]payment.Status{}
	for i, s := range sinks {
		for _, r := range s.Requests() {
			require.False(t, seen[r.EventID], "event %s delivered twice", r.EventID)
			seen[r.EventID] = true
			require.NoError(t, outbox.Verify(merchants[i].WebhookSecret, r.Signature, r.Body, time.Minute))
			w := testkit.DecodeWebhook(t, r.Body)
			require.Equal(t, r.EventID, w.ID)
			require.Equal(t, "payment."+string(w.Data.Status), w.Type)
			statuses[w.Data.ID] = append(statuses[w.Data.ID], w.Data.Status)
		}
	}
	require.Len(t, seen, events, "each of the 1,000 events exactly once")
	require.Len(t, statuses, direct+viaUnknown)
	twoEvents := 0
	for id, st := range statuses {
		if len(st) == 2 {
			twoEvents++
			require.Equal(t, []payment.Status{payment.StatusUnknown, payment.StatusSucceeded}, st, "payment %s", id)
		} else {
			require.Equal(t, []payment.Status{payment.StatusSucceeded}, st, "payment %s", id)
		}
	}
	require.Equal(t, viaUnknown, twoEvents)

	// The database agrees: one delivered row per event, each on its first attempt.
	for _, m := range merchants {
		ds, err := db.MerchantDeliveries(ctx, m.ID, 2*events)
		require.NoError(t, err)
		for _, d := range ds {
			require.Equal(t, store.DeliveryDelivered, d.Status, "delivery %s", d.ID)
			require.Equal(t, 1, d.AttemptCount)
			require.True(t, seen[d.ID.String()])
		}
		require.NotEmpty(t, ds)
	}
	families, err := reg.Gather()
	require.NoError(t, err)
	delivered := 0.0
	for _, f := range families {
		if f.GetName() == "kasa_webhook_deliveries_total" {
			for _, m := range f.GetMetric() {
				if m.GetLabel()[0].GetValue() == "delivered" {
					delivered = m.GetCounter().GetValue()
				}
			}
		}
	}
	require.Equal(t, float64(events), delivered)
	requireVerified(t)
}

// A payment made through the REST API and the workflow reaches the merchant's webhook URL, signed
// with the webhook secret the admin API returned, carrying the payment resource the API serves.
// 5. The signature fails with another merchant's secret, a tampered body and an old timestamp.
func TestEventWebhookOfARealPayment(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	hook := newSink(t)
	startEventPipeline(t)

	r := s.do("POST", "/admin/v1/merchants", adminToken, fmt.Sprintf(`{"name":"Hooked","webhook_url":%q}`, hook.URL))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	created := r.json(t)
	m := merchant{ID: created["id"].(string), APIKey: created["api_key"].(string)}
	secret := created["webhook_secret"].(string)
	other := s.do("POST", "/admin/v1/merchants", adminToken, `{"name":"Other"}`).json(t)["webhook_secret"].(string)
	account := s.newAccount(m, "TRY", "500.00")

	r = s.pay(m, "hook-1", payBody("inv-hook-1", "120.50", "TRY", account))
	require.Equal(t, http.StatusCreated, r.Status, "%s", r.Body)
	paymentID := r.json(t)["id"].(string)

	require.Eventually(t, func() bool { return len(hook.Requests()) == 1 }, 30*time.Second, 20*time.Millisecond)
	got := hook.Requests()[0]
	require.Equal(t, "application/json", got.ContentType)
	w := testkit.DecodeWebhook(t, got.Body)
	require.Equal(t, got.EventID, w.ID)
	require.Equal(t, "payment.succeeded", w.Type)
	require.Equal(t, paymentID, w.Data.ID)
	require.Equal(t, "120.50", w.Data.Amount)

	// data is the resource GET /v1/payments/{id} answers.
	res := s.do("GET", "/v1/payments/"+paymentID, m.APIKey, "")
	require.Equal(t, http.StatusOK, res.Status)
	var served, sent map[string]any
	require.NoError(t, json.Unmarshal(res.Body, &served))
	require.NoError(t, json.Unmarshal(got.Body, &sent))
	require.Equal(t, served, sent["data"])

	require.NoError(t, outbox.Verify(secret, got.Signature, got.Body, 5*time.Minute))
	require.ErrorIs(t, outbox.Verify(other, got.Signature, got.Body, 5*time.Minute), outbox.ErrSignatureMismatch)
	tampered := bytes.Replace(got.Body, []byte(`"120.50"`), []byte(`"920.50"`), 1)
	require.NotEqual(t, got.Body, tampered)
	require.ErrorIs(t, outbox.Verify(secret, got.Signature, tampered, 5*time.Minute), outbox.ErrSignatureMismatch)
	old := outbox.Sign(secret, time.Now().Add(-time.Hour), got.Body)
	require.ErrorIs(t, outbox.Verify(secret, old, got.Body, 5*time.Minute), outbox.ErrSignatureExpired)
	require.True(t, strings.HasPrefix(got.Signature, "t="))

	ds, err := db.PaymentDeliveries(context.Background(), mustUUID(t, paymentID))
	require.NoError(t, err)
	require.Len(t, ds, 1)
	require.Equal(t, got.EventID, ds[0].ID.String())
	require.Eventually(t, func() bool {
		d, err := db.Delivery(context.Background(), ds[0].ID)
		return err == nil && d.Status == store.DeliveryDelivered
	}, 5*time.Second, 20*time.Millisecond)

	// The operators' view: GET /admin/v1/merchants/{id}/deliveries, then a redelivery on purpose.
	list := s.do("GET", "/admin/v1/merchants/"+m.ID+"/deliveries?limit=10", adminToken, "")
	require.Equal(t, http.StatusOK, list.Status, "%s", list.Body)
	var listed struct {
		MerchantID string `json:"merchant_id"`
		Deliveries []struct {
			ID, Status, PaymentID string
			EventType             string `json:"event_type"`
			Attempts              []struct {
				Attempt    int  `json:"attempt"`
				StatusCode *int `json:"status_code"`
			} `json:"attempts"`
		} `json:"deliveries"`
	}
	require.NoError(t, json.Unmarshal(list.Body, &listed))
	require.Equal(t, m.ID, listed.MerchantID)
	require.Len(t, listed.Deliveries, 1)
	require.Equal(t, got.EventID, listed.Deliveries[0].ID)
	require.Equal(t, "delivered", listed.Deliveries[0].Status)
	require.Equal(t, "payment.succeeded", listed.Deliveries[0].EventType)
	require.Len(t, listed.Deliveries[0].Attempts, 1)
	require.Equal(t, http.StatusOK, *listed.Deliveries[0].Attempts[0].StatusCode)
	require.Equal(t, http.StatusBadRequest, s.do("GET", "/admin/v1/merchants/"+m.ID+"/deliveries?limit=0", adminToken, "").Status)
	require.Equal(t, http.StatusUnauthorized, s.do("GET", "/admin/v1/merchants/"+m.ID+"/deliveries", m.APIKey, "").Status)

	re := s.do("POST", "/admin/v1/deliveries/"+got.EventID+"/redeliver", adminToken, "")
	require.Equal(t, http.StatusAccepted, re.Status, "%s", re.Body)
	require.Equal(t, "pending", re.json(t)["status"])
	require.Nil(t, re.json(t)["delivered_at"], "pending again: not delivered")
	require.Eventually(t, func() bool { return len(hook.Requests()) == 2 }, 30*time.Second, 20*time.Millisecond)
	again := hook.Requests()[1]
	require.Equal(t, got.EventID, again.EventID, "the same event, again")
	require.Equal(t, got.Body, again.Body, "byte for byte")
	require.NoError(t, outbox.Verify(secret, again.Signature, again.Body, 5*time.Minute))
	require.Equal(t, http.StatusNotFound, s.do("POST", "/admin/v1/deliveries/"+payment.NewID().String()+"/redeliver", adminToken, "").Status)
	require.Equal(t, 1, s.simCount(paymentID), "webhooks never touch the money")
}

// A manual payment's events reach its merchant in order: payment.requires_capture, then
// payment.captured, or payment.canceled; each carries the payment as it was then.
func TestEventsOfAManualPayment(t *testing.T) {
	s := newStack(t, workflows.CapabilityIdempotent)
	hook := newSink(t)
	startEventPipeline(t)
	m := s.newHookedMerchant(hook.URL)

	captured, _, _ := s.authorize(m, "ev-cap", "30.00", "100.00")
	require.Equal(t, http.StatusCreated, s.command(m, captured, "capture", "ev-cap-1", `{"amount":"20.00"}`).Status)
	canceled, _, _ := s.authorize(m, "ev-cancel", "10.00", "100.00")
	require.Equal(t, http.StatusOK, s.command(m, canceled, "cancel", "ev-cancel-1", "").Status)

	require.Eventually(t, func() bool { return len(hook.Requests()) == 4 }, 30*time.Second, 20*time.Millisecond)
	events := map[string][]string{}
	for _, got := range hook.Requests() {
		w := testkit.DecodeWebhook(t, got.Body)
		events[w.Data.ID] = append(events[w.Data.ID], w.Type+" "+string(w.Data.Status))
	}
	require.Equal(t, []string{"payment.requires_capture requires_capture", "payment.captured succeeded"}, events[captured])
	require.Equal(t, []string{"payment.requires_capture requires_capture", "payment.canceled canceled"}, events[canceled])
}
