package store

import (
	"context"

	"github.com/google/uuid"
)

// OutboxEvents reads the outbox rows of these ids (store/queries/events.sql), in no particular
// order; an id without a row (never written, or purged by retention) is left out.
func (s *Store) OutboxEvents(ctx context.Context, ids []uuid.UUID) ([]OutboxEvent, error) {
	rows, err := s.q.OutboxEventsByID(ctx, ids)
	if err != nil {
		return nil, translate(err)
	}
	out := make([]OutboxEvent, len(rows))
	for i, r := range rows {
		out[i] = OutboxEvent{ID: r.ID, AggregateID: r.AggregateID, Type: r.Type, Payload: r.Payload, CreatedAt: r.CreatedAt}
	}
	return out, nil
}
