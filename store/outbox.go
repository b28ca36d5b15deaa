package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// The outbox the relay drains (store/queries/outbox.sql). Order per aggregate (payment) is
// explicit at every hop: the relay claims only the oldest unpublished event of each aggregate, the
// webhook consumer records an event after every earlier one of its aggregate that its inbox lacks,
// read from the outbox (events.go, inbox.go), and the sender claims a delivery only when no
// earlier delivery of its aggregate is pending (deliveries.go).

// OutboxEvent is one outbox row on its way to the broker.
type OutboxEvent struct {
	ID          uuid.UUID // the event id and the broker's message id
	AggregateID uuid.UUID // the payment
	Type        string    // "payment.succeeded", ...
	Payload     []byte    // the payment resource (JSON)
	CreatedAt   time.Time // in the payment's transaction
}

// RelayOutbox claims up to limit unpublished events (FOR UPDATE SKIP LOCKED: concurrent relays
// take disjoint rows; at most one event per aggregate, the oldest), hands them to publish in
// (created_at, id) order, and marks published the ids publish returns (those the broker
// acknowledged), all in one transaction. The rows stay locked while publish runs. If publish
// fails, what it acknowledged is still marked and its error returned; the rest is retried.
func (s *Store) RelayOutbox(ctx context.Context, limit int, publish func(context.Context, []OutboxEvent) ([]uuid.UUID, error)) (claimed, published int, err error) {
	var pubErr error
	err = s.tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, dbsqlc.ClaimOutbox, limit)
		if err != nil {
			return err
		}
		events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxEvent, error) {
			var e OutboxEvent
			err := r.Scan(&e.ID, &e.AggregateID, &e.Type, &e.Payload, &e.CreatedAt)
			return e, err
		})
		if err != nil || len(events) == 0 {
			return err
		}
		claimed = len(events)
		var acked []uuid.UUID
		acked, pubErr = publish(ctx, events)
		if len(acked) == 0 {
			return nil
		}
		n, err := s.q.WithTx(tx).MarkPublished(ctx, acked)
		published = int(n)
		return err
	})
	if err != nil {
		return claimed, 0, err
	}
	return claimed, published, pubErr
}

// OutboxBacklog counts unpublished events and returns the oldest one's age by the database's
// clock, which stamped it (zero when there is none): a relay's host clock may be minutes off.
func (s *Store) OutboxBacklog(ctx context.Context) (count int64, age time.Duration, err error) {
	var seconds float64
	err = s.pool.QueryRow(ctx, dbsqlc.OutboxBacklog).Scan(&count, &seconds)
	return count, time.Duration(seconds * float64(time.Second)), translate(err)
}

// Purged counts the rows one retention pass deleted.
type Purged struct{ Outbox, Inbox, Deliveries int64 }

// PurgeEvents deletes published outbox rows, inbox rows (once their outbox rows are gone) and
// finished webhook deliveries (with their attempts) older than olderThan, batch rows per
// statement (each its own short transaction, so no table is locked for long). Relays purging at
// once take turns, a statement each.
func (s *Store) PurgeEvents(ctx context.Context, olderThan time.Duration, batch int) (Purged, error) {
	purge := func(sql string, total *int64) error {
		for {
			var n int64
			err := s.tx(ctx, func(tx pgx.Tx) error {
				if err := s.q.WithTx(tx).LockPurge(ctx); err != nil {
					return err
				}
				tag, err := tx.Exec(ctx, sql, olderThan.Seconds(), batch)
				n = tag.RowsAffected()
				return err
			})
			if err != nil {
				return err
			}
			*total += n
			if n < int64(batch) {
				return nil
			}
		}
	}
	var p Purged
	if err := purge(dbsqlc.PurgeOutbox, &p.Outbox); err != nil {
		return p, err
	}
	if err := purge(dbsqlc.PurgeInbox, &p.Inbox); err != nil {
		return p, err
	}
	return p, purge(dbsqlc.PurgeDeliveries, &p.Deliveries)
}
