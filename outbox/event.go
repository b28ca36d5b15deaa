// Package outbox moves events from the transactional outbox to the broker and from the broker to
// merchants (docs/webhooks.md):
//
//   - Relay: claims unpublished outbox rows (FOR UPDATE SKIP LOCKED), publishes each to JetStream
//     subject kasa.events.<type> of stream KASA_EVENTS with Nats-Msg-Id = the row id, and marks
//     them published once the broker acknowledged them. At least once; the broker de-duplicates
//     within its window and consumers de-duplicate with their inbox forever after. What the
//     inbox still lacks long after is published again under ids of its own (republishedMsgID).
//   - WebhookConsumer: a durable pull consumer that records each message in the inbox and
//     creates its webhook delivery in the same transaction, acking only after the commit. A
//     message only names its event: the body delivered is built from the outbox row, so the
//     broker need not be trusted with what kasa signs.
//   - WebhookSender: POSTs due deliveries to merchants, signed (Sign/Verify), with a timeout
//     per attempt, exponential backoff with jitter and an attempt log, for at least 24 h.
//
// Events of one payment reach the broker, the inbox and the merchant in the order they were
// committed: see the store's RelayOutbox, EventsToRecord, AcceptEvents and ClaimDeliveries.
package outbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/payment"
)

// Broker names.
const (
	StreamName       = "KASA_EVENTS"
	SubjectPrefix    = "kasa.events."
	WebhooksConsumer = "webhooks" // the durable consumer's name and the inbox's consumer column
)

// webhookSubjects are the subjects of the events merchants receive. Every event type the outbox
// holds must be under them: the relay publishes again, for a day, an event the webhook
// consumer's inbox lacks.
var webhookSubjects = []string{SubjectPrefix + "payment.>", SubjectPrefix + "refund.>"}

// Event types merchants receive.
var webhookTypes = map[string]bool{
	"payment.succeeded": true, "payment.failed": true, "payment.unknown": true,
	"payment.requires_capture": true, "payment.captured": true, "payment.canceled": true,
	"refund.succeeded": true, "refund.failed": true, "refund.unknown": true,
}

// Subject is the broker subject of an event type.
func Subject(eventType string) string { return SubjectPrefix + eventType }

// Event is the broker message body: the outbox row as an envelope. Its ID, not the Nats-Msg-Id
// header, is what consumers de-duplicate on, and the webhook consumer reads the rest from the
// outbox row of that ID.
type Event struct {
	ID          uuid.UUID       `json:"id"`
	Type        string          `json:"type"`
	AggregateID uuid.UUID       `json:"aggregate_id"`
	CreatedAt   time.Time       `json:"created_at"`
	Data        json.RawMessage `json:"data"`
}

// WebhookBody renders the body merchants receive (docs/webhooks.md):
// {"id": "<event id>", "type": "payment.succeeded", "created_at": "...", "data": <payment or refund resource>}.
// The resource is re-encoded in the API's field order when it decodes as one.
func WebhookBody(e Event) ([]byte, error) {
	var data []byte
	if strings.HasPrefix(e.Type, "refund.") {
		data = reorder[payment.RefundResource](e.Data, nil)
	} else {
		data = reorder(e.Data, func(r *payment.Resource) {
			if r.AmountRefunded == "" { // an event queued before refunds existed: none were made
				r.AmountRefunded = payment.FormatAmount(0, r.Currency)
			}
		})
	}
	if data == nil {
		var buf bytes.Buffer
		if err := json.Compact(&buf, e.Data); err != nil {
			return nil, fmt.Errorf("event %s data: %w", e.ID, err)
		}
		data = buf.Bytes()
	}
	return marshal(struct {
		ID        string          `json:"id"`
		Type      string          `json:"type"`
		CreatedAt string          `json:"created_at"`
		Data      json.RawMessage `json:"data"`
	}{e.ID.String(), e.Type, payment.FormatTime(e.CreatedAt), data})
}

// reorder renders data as the resource T in the API's field order (the outbox's jsonb reorders
// keys), or returns nil when data is not exactly a T.
func reorder[T any](data []byte, fix func(*T)) []byte {
	var res T
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if dec.Decode(&res) != nil {
		return nil
	}
	if fix != nil {
		fix(&res)
	}
	b, err := marshal(res)
	if err != nil {
		return nil
	}
	return b
}

// marshal encodes as the API does (payment.JSON), without the trailing newline.
func marshal(v any) ([]byte, error) {
	b, err := payment.JSON(v)
	return bytes.TrimRight(b, "\n"), err
}
