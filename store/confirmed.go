package store

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// A broker may acknowledge a message and then lose it, so an outbox row counts as delivered only
// once the consumer's inbox holds it (store/queries/outbox.sql, outbox_confirmed). A point per
// consumer marks how far that is known; the relay publishes again what the inbox lacks after it.

// UnconfirmedQuery says which published outbox rows a consumer's inbox is checked for.
type UnconfirmedQuery struct {
	Consumer string        // the inbox
	After    time.Duration // rows published less than this ago are not checked yet
	GiveUp   time.Duration // rows published longer ago than this are passed over, not republished
	Page     int           // rows read per statement
	Pages    int           // most statements per call
	// Ahead: rows published after this may still be in the stream ahead of a consumer that is
	// only behind; they are not read (zero: no such bound).
	Ahead time.Time
}

// Unconfirmed is what one check found.
type Unconfirmed struct {
	Due     []OutboxEvent // published, not in the inbox: publish them again (oldest first)
	GaveUp  []uuid.UUID   // published longer than GiveUp ago and never in the inbox
	Checked int           // rows read
	Busy    bool          // another relay holds the point: nothing was checked
}

// UnconfirmedOutbox reads the rows published after the consumer's point and more than q.After
// ago, in publication order, q.Pages pages of q.Page rows at most, and moves the point over the
// leading ones the inbox holds (and those given up). The point stops at the first row the inbox
// lacks: every row read from there that the inbox lacks is due, so that after a broker lost many
// events one check has them all published again. One relay at a time does this: the point is
// locked while it moves, and another relay finds it Busy.
//
// Rows are read only once published more than q.After ago: a relay's transaction commits its
// published_at (the transaction's start) well within that, so no row appears behind the point.
func (s *Store) UnconfirmedOutbox(ctx context.Context, q UnconfirmedQuery) (Unconfirmed, error) {
	var u Unconfirmed
	err := s.tx(ctx, func(tx pgx.Tx) error {
		qt := s.q.WithTx(tx)
		point, err := qt.LockOutboxConfirmed(ctx, q.Consumer)
		if errors.Is(err, pgx.ErrNoRows) { // no point yet, or another relay holds it
			var started dbsqlc.StartOutboxConfirmedRow
			started, err = qt.StartOutboxConfirmed(ctx, q.Consumer)
			point = dbsqlc.LockOutboxConfirmedRow(started)
			if errors.Is(err, pgx.ErrNoRows) {
				u.Busy = true
				return nil
			}
		}
		if err != nil {
			return err
		}
		start, read, page := point, point, max(q.Page, 1)
		ahead := q.Ahead
		if ahead.IsZero() {
			ahead = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
		}
		var due []uuid.UUID
		for range max(q.Pages, 1) {
			rows, err := qt.OutboxAfterConfirmed(ctx, dbsqlc.OutboxAfterConfirmedParams{
				Consumer: q.Consumer, PointAt: read.PublishedAt, PointID: read.ID,
				OlderThan: q.After.Seconds(), GiveUp: q.GiveUp.Seconds(), Ahead: ahead, Page: int32(page),
			})
			if err != nil {
				return err
			}
			u.Checked += len(rows)
			for _, r := range rows {
				read = dbsqlc.LockOutboxConfirmedRow{PublishedAt: r.PublishedAt, ID: r.ID}
				switch {
				case r.Inboxed && len(due) == 0:
					point = dbsqlc.LockOutboxConfirmedRow{PublishedAt: r.PublishedAt, ID: r.ID}
				case r.Inboxed:
				case r.Expired && len(due) == 0:
					u.GaveUp = append(u.GaveUp, r.ID)
					point = dbsqlc.LockOutboxConfirmedRow{PublishedAt: r.PublishedAt, ID: r.ID}
				default:
					due = append(due, r.ID)
				}
			}
			if len(rows) < page {
				break
			}
		}
		if point != start {
			if err := qt.MoveOutboxConfirmed(ctx, dbsqlc.MoveOutboxConfirmedParams{Consumer: q.Consumer, PublishedAt: point.PublishedAt, ID: point.ID}); err != nil {
				return err
			}
		}
		if len(due) == 0 {
			return nil
		}
		rows, err := qt.OutboxEventsByID(ctx, due)
		if err != nil {
			return err
		}
		u.Due = make([]OutboxEvent, len(rows))
		for i, r := range rows {
			u.Due[i] = OutboxEvent{ID: r.ID, AggregateID: r.AggregateID, Type: r.Type, Payload: r.Payload, CreatedAt: r.CreatedAt}
		}
		// In commit order, as the relay first published them: an aggregate's events stay in order.
		slices.SortFunc(u.Due, func(a, b OutboxEvent) int {
			if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
				return c
			}
			return slices.Compare(a.ID[:], b.ID[:])
		})
		return nil
	})
	if err != nil {
		return Unconfirmed{}, translate(err)
	}
	return u, nil
}

// ConfirmedAt is consumer's confirmed point: every event published up to then is in its inbox
// (or was given up), with the database's clock as it was read (the point is that clock's time).
// False when the relay has not started one.
func (s *Store) ConfirmedAt(ctx context.Context, consumer string) (at, now time.Time, ok bool, err error) {
	r, err := s.q.OutboxConfirmedAt(ctx, consumer)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, time.Time{}, false, translate(err)
	}
	return r.PublishedAt, r.DbNow, true, nil
}

// EventProgress is how far one outbox row went.
type EventProgress struct {
	ID          uuid.UUID
	PublishedAt *time.Time // the broker acknowledged it (nil: not yet)
	Inboxed     bool       // the consumer's inbox holds it
}

// OutboxProgress says, for each of these outbox rows (those that exist), whether it was published
// and whether consumer's inbox holds it.
func (s *Store) OutboxProgress(ctx context.Context, consumer string, ids []uuid.UUID) ([]EventProgress, error) {
	rows, err := s.q.OutboxProgress(ctx, dbsqlc.OutboxProgressParams{Consumer: consumer, Ids: ids})
	if err != nil {
		return nil, translate(err)
	}
	out := make([]EventProgress, len(rows))
	for i, r := range rows {
		out[i] = EventProgress{ID: r.ID, PublishedAt: r.PublishedAt, Inboxed: r.Inboxed}
	}
	return out, nil
}
