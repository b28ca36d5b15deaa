-- Outbox rows read by id: the webhook consumer builds what it delivers from these, never from
-- the broker message, which only names the event.

-- name: OutboxEventsByID :many
SELECT id, aggregate_id, type, payload, created_at FROM outbox WHERE id = ANY(@ids::uuid[]);

-- name: OutboxEventsInboxLacks :many
-- The rows of these ids, and every earlier event of their aggregates that the consumer's inbox
-- lacks: the outbox, not the broker, is where an aggregate's events and their order are kept, so
-- an event is never recorded ahead of an earlier one the broker lost or has not handed over yet.
-- In commit order (created_at, id), as the relay publishes an aggregate's events.
SELECT id, aggregate_id, type, payload, created_at FROM (
  SELECT DISTINCT ON (e.id) e.id, e.aggregate_id, e.type, e.payload, e.created_at
  FROM outbox n JOIN outbox e ON e.aggregate_id = n.aggregate_id AND (e.created_at, e.id) <= (n.created_at, n.id)
  WHERE n.id = ANY(@ids::uuid[])
    AND (e.id = n.id OR NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = @consumer AND i.message_id = e.id))
  ORDER BY e.id) x
ORDER BY created_at, id;
