-- Outbox rows read by id: the webhook consumer builds what it delivers from these, never from
-- the broker message, which only names the event.

-- name: OutboxEventsByID :many
SELECT id, aggregate_id, type, payload, created_at FROM outbox WHERE id = ANY(@ids::uuid[]);
