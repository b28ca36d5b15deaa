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

// AcceptEvents records events in consumer's inbox and creates their deliveries, in the order
// given and in one transaction (one round trip), and says what became of each. An event already
// in the inbox changes nothing. The caller gives an aggregate's events in order, earlier ones
// first (EventsToRecord finds those the inbox lacks). Any error writes nothing.
func (s *Store) AcceptEvents(ctx context.Context, consumer string, es []NewDelivery) ([]Acceptance, error) {
	out := make([]Acceptance, len(es))
	err := s.pipelined(ctx, func(tx *pipeTx) error {
		b := &pgx.Batch{}
		for _, e := range es {
			// A nil Body goes as NULL: the inbox row only.
			b.Queue(dbsqlc.AcceptEvent, e.EventID, e.AggregateID, e.Type, e.CreatedAt, e.Body, consumer)
		}
		return tx.commitWith(ctx, b, func(br pgx.BatchResults) error {
			for i, e := range es {
				var inboxed, existed bool
				var status string
				if err := br.QueryRow().Scan(&inboxed, &status, &existed); err != nil {
					return err
				}
				out[i] = acceptance(e, inboxed, status, existed)
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func acceptance(e NewDelivery, inboxed bool, status string, existed bool) Acceptance {
	switch {
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
