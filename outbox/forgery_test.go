package outbox

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
	"github.com/kasa-pay/kasa/tools/testkit"
)

// forge is a broker message a publisher without the database could send: e with its data's
// amount replaced.
func forge(t *testing.T, e store.OutboxEvent, amount string) *nats.Msg {
	t.Helper()
	var data map[string]any
	require.NoError(t, json.Unmarshal(e.Payload, &data))
	data["amount"] = amount
	b, err := json.Marshal(data)
	require.NoError(t, err)
	e.Payload = b
	msg, err := message(e)
	require.NoError(t, err)
	return msg
}

// Anyone who can publish to the events subject cannot have kasa sign a body it did not commit:
// a message whose id is no outbox row is dropped, and one that reuses a real event's id with
// another body delivers the body in the database.
func TestForgedBrokerMessagesAreNotDelivered(t *testing.T) {
	ctx := context.Background()
	b := newBroker(t)
	h := newHook(t, answer(http.StatusOK))
	m := newMerchant(t, h.URL)
	pid := settle(t, m, false)
	real := peek(t, pid)

	// An id that is no outbox row, of a real payment, and the real id with another amount;
	// both before the relay publishes the real event.
	invented := real
	invented.ID = payment.NewID()
	for _, msg := range []*nats.Msg{forge(t, invented, "9999.00"), forge(t, real, "8888.00")} {
		_, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(uuid.NewString()))
		require.NoError(t, err)
	}

	p := startPipeline(t, b, pipelineOptions{relays: 1})
	require.Eventually(t, func() bool { return h.Count() >= 1 && b.consumerIdle(t) }, 10*time.Second, 20*time.Millisecond)
	requireBacklogEmpty(t)
	require.Eventually(t, func() bool { return b.consumerIdle(t) }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(200 * time.Millisecond)

	want, err := WebhookBody(Event{ID: real.ID, Type: real.Type, AggregateID: real.AggregateID, CreatedAt: real.CreatedAt, Data: real.Payload})
	require.NoError(t, err)
	reqs := h.Requests()
	require.Len(t, reqs, 1, "only the committed event reaches the merchant")
	require.Equal(t, real.ID.String(), reqs[0].EventID)
	require.Equal(t, string(want), string(reqs[0].Body))
	require.Equal(t, "1.00", testkit.DecodeWebhook(t, reqs[0].Body).Data.Amount)

	_, err = db.Delivery(ctx, invented.ID)
	require.ErrorIs(t, err, payment.ErrNotFound, "no delivery for an id the outbox never had")
	d, err := db.PaymentDeliveries(ctx, pid)
	require.NoError(t, err)
	require.Len(t, d, 1)
	require.Equal(t, real.ID, d[0].ID)
	require.Equal(t, 1.0, value(t, p.metrics.consumed.WithLabelValues("unknown")), "the invented id is counted")
}
