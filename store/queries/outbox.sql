-- The outbox the relay drains. The relay claims only the oldest unpublished event of each
-- aggregate, so a later event is published only after the earlier one was acknowledged by the
-- broker and marked, whatever the number of relays.

-- name: InsertOutboxEvent :exec
INSERT INTO outbox (id, aggregate_id, type, payload) VALUES ($1, $2, $3, $4);

-- name: ClaimOutbox :many
SELECT o.id, o.aggregate_id, o.type, o.payload, o.created_at
FROM outbox o
WHERE o.published_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM outbox e
      WHERE e.aggregate_id = o.aggregate_id AND e.published_at IS NULL
        AND (e.created_at, e.id) < (o.created_at, o.id))
ORDER BY o.created_at, o.id
LIMIT $1
FOR UPDATE OF o SKIP LOCKED;

-- name: MarkPublished :execrows
UPDATE outbox SET published_at = now() WHERE id = ANY($1::uuid[]) AND published_at IS NULL;

-- name: OutboxBacklog :one
SELECT count(*), coalesce(min(created_at), 'epoch') FROM outbox WHERE published_at IS NULL;

-- name: PurgeOutbox :execrows
DELETE FROM outbox WHERE id IN (SELECT id FROM outbox
WHERE published_at < now() - $1::float8 * interval '1 second' ORDER BY published_at LIMIT $2);
