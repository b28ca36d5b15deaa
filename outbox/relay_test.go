package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kasa-pay/kasa/payment"
	"github.com/kasa-pay/kasa/store"
)

// An event that cannot be made a message is left out of a batch without shifting the acks of
// the events after it: only what the broker acknowledged is reported published.
func TestPublishReportsTheAcknowledgedEvents(t *testing.T) {
	b := newBroker(t)
	r := NewRelay(RelayOptions{Store: db, JetStream: b.js, Metrics: NewMetrics(prometheus.NewRegistry()), Logger: quiet})
	events := []store.OutboxEvent{
		{ID: payment.NewID(), AggregateID: payment.NewID(), Type: "payment.succeeded", Payload: []byte(`{}`), CreatedAt: time.Now()},
		{ID: payment.NewID(), AggregateID: payment.NewID(), Type: "payment.succeeded", Payload: []byte(`{`), CreatedAt: time.Now()},
		{ID: payment.NewID(), AggregateID: payment.NewID(), Type: "payment.succeeded", Payload: []byte(`{}`), CreatedAt: time.Now()},
	}
	acked, _, err := r.publish(context.Background(), events, nil)
	require.Error(t, err, "the unreadable event")
	require.ElementsMatch(t, []uuid.UUID{events[0].ID, events[2].ID}, acked)
}

// An event the inbox lacks is given up (logged, counted) while its outbox row still exists:
// retention deletes published rows, and an event deleted first would be lost without a word.
func TestRedeliveryGivesUpBeforeRetentionDeletes(t *testing.T) {
	for _, tc := range []struct{ retention, redeliverFor, want time.Duration }{
		{0, 0, 24 * time.Hour},
		{7 * 24 * time.Hour, 0, 24 * time.Hour},
		{time.Hour, 0, 30 * time.Minute},
		{time.Hour, 24 * time.Hour, 30 * time.Minute},
		{40 * time.Hour, 0, 20 * time.Hour},
		{40 * time.Hour, time.Hour, time.Hour},
	} {
		got := NewRelay(RelayOptions{Retention: tc.retention, RedeliverFor: tc.redeliverFor}).o.RedeliverFor
		require.Equal(t, tc.want, got, "retention %s, redeliver for %s", tc.retention, tc.redeliverFor)
	}
}
