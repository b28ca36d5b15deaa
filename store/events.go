package store

import (
	"context"

	"github.com/google/uuid"

	"github.com/kasa-pay/kasa/store/internal/dbsqlc"
)

// EventsToRecord reads what consumer records for these event ids: their outbox rows, and every
// earlier event of their aggregates that its inbox lacks (store/queries/events.sql), in commit
// order; an id without a row (never written, or purged by retention) is left out.
func (s *Store) EventsToRecord(ctx context.Context, consumer string, ids []uuid.UUID) ([]OutboxEvent, error) {
	rows, err := s.q.OutboxEventsInboxLacks(ctx, dbsqlc.OutboxEventsInboxLacksParams{Ids: ids, Consumer: consumer})
	if err != nil {
		return nil, translate(err)
	}
	out := make([]OutboxEvent, len(rows))
	for i, r := range rows {
		out[i] = OutboxEvent{ID: r.ID, AggregateID: r.AggregateID, Type: r.Type, Payload: r.Payload, CreatedAt: r.CreatedAt}
	}
	return out, nil
}
