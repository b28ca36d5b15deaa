package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// A consumer's inbox (store/queries/inbox.sql): each message's effect happens once.

// Acceptance is what a consumer's inbox made of a message.
type Acceptance string

const (
	AcceptedPending   Acceptance = "pending"   // new: a delivery is due
	AcceptedSkipped   Acceptance = "skipped"   // new: the merchant has no webhook URL
	AcceptedDuplicate Acceptance = "duplicate" // the message id is in the inbox already
	AcceptedOrphan    Acceptance = "orphan"    // new, but no such payment: recorded, nothing to deliver
	AcceptedDeferred  Acceptance = "deferred"  // an earlier event of the aggregate comes first: redeliver later
	AcceptedIgnored   Acceptance = "ignored"   // new, of a type this consumer does not deliver (no Body): inbox only
)

// NewDelivery is an event a webhook consumer received, with the exact body merchants get.
type NewDelivery struct {
	EventID     uuid.UUID // the message id
	AggregateID uuid.UUID // the payment
	Type        string
	CreatedAt   time.Time // the outbox row's
	Body        []byte    // nil: nothing to deliver, only record the message
}

// AcceptEvents records messages in consumer's inbox and creates their deliveries, in order and
// in one transaction (one round trip), and says what became of each. A message already in the
// inbox changes nothing. An event is deferred (nothing written for it) while an earlier event
// of its payment, published less than orderGrace ago, has not been through this inbox yet; an
// earlier event in the same batch counts once it is accepted. Any error writes nothing.
func (s *Store) AcceptEvents(ctx context.Context, consumer string, es []NewDelivery, orderGrace time.Duration) ([]Acceptance, error) {
	out := make([]Acceptance, len(es))
	err := s.pipelined(ctx, func(tx *pipeTx) error {
		b := &pgx.Batch{}
		for _, e := range es {
			// A nil Body goes as NULL: the inbox row only.
			b.Queue(dbsqlc.AcceptEvent, e.EventID, e.AggregateID, e.Type, e.CreatedAt, e.Body, consumer, orderGrace.Seconds())
		}
		return tx.commitWith(ctx, b, func(br pgx.BatchResults) error {
			for i, e := range es {
				var waiting, inboxed, existed bool
				var status string
				if err := br.QueryRow().Scan(&waiting, &inboxed, &status, &existed); err != nil {
					return err
				}
				out[i] = acceptance(e, waiting, inboxed, status, existed)
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func acceptance(e NewDelivery, waiting, inboxed bool, status string, existed bool) Acceptance {
	switch {
	case waiting:
		return AcceptedDeferred
	case !inboxed:
		return AcceptedDuplicate
	case e.Body == nil:
		return AcceptedIgnored
	case status != "":
		return Acceptance(status)
	case existed: // the inbox row was purged, the delivery was not
		return AcceptedDuplicate
	default:
		return AcceptedOrphan
	}
}
