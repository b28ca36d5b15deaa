-- The outbox the relay drains. The relay claims only the oldest unpublished event of each
-- aggregate, so a later event is published only after the earlier one was acknowledged by the
-- broker and marked, whatever the number of relays.

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
-- The age is the database's: its clock stamped created_at.
SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS age_seconds
FROM outbox WHERE published_at IS NULL;

-- name: LockPurge :exec
-- One retention statement at a time across every relay, until its transaction ends: two
-- deleting overlapping rows would lock them in different orders and deadlock.
SELECT pg_advisory_xact_lock(hashtextextended('kasa/purge', 0));

-- name: PurgeOutbox :execrows
DELETE FROM outbox WHERE id IN (SELECT id FROM outbox
WHERE published_at < now() - $1::float8 * interval '1 second' ORDER BY published_at LIMIT $2);

-- name: LockOutboxConfirmed :one
-- A consumer's confirmed point (outbox_confirmed): one relay at a time reads and moves it.
SELECT published_at, id FROM outbox_confirmed WHERE consumer = $1 FOR UPDATE SKIP LOCKED;

-- name: OutboxConfirmedAt :one
-- How far a consumer's inbox is known complete, without waiting for the relay that moves it, and
-- the database's clock that stamped it.
SELECT published_at, now()::timestamptz AS db_now FROM outbox_confirmed WHERE consumer = $1;

-- name: StartOutboxConfirmed :one
-- A consumer without a point starts at now: it is watched from its first check on. No row: the
-- point exists (another relay holds it).
INSERT INTO outbox_confirmed (consumer, published_at, id)
VALUES ($1, now(), '00000000-0000-0000-0000-000000000000') ON CONFLICT DO NOTHING
RETURNING published_at, id;

-- name: OutboxAfterConfirmed :many
-- The rows published after the point, more than older_than seconds ago and not after ahead, in
-- publication order, each with whether the consumer's inbox holds it and whether it was published more than
-- give_up seconds ago. outbox_published_order gives the page in this order from the point on;
-- the inbox is probed by key for the page's rows only (an EXISTS is planned as a hash of the
-- whole inbox).
SELECT p.id, p.published_at, (i.held IS NOT NULL)::boolean AS inboxed,
       p.published_at < now() - sqlc.arg(give_up)::float8 * interval '1 second' AS expired
FROM (SELECT o.id, o.published_at::timestamptz AS published_at FROM outbox o
      WHERE (o.published_at, o.id) > (sqlc.arg(point_at)::timestamptz, sqlc.arg(point_id)::uuid)
        AND o.published_at < now() - sqlc.arg(older_than)::float8 * interval '1 second'
        AND o.published_at <= sqlc.arg(ahead)::timestamptz
      ORDER BY o.published_at, o.id
      LIMIT sqlc.arg(page)) p
LEFT JOIN LATERAL (SELECT true AS held FROM inbox i
                   WHERE i.consumer = sqlc.arg(consumer) AND i.message_id = p.id LIMIT 1) i ON true
ORDER BY p.published_at, p.id;

-- name: MoveOutboxConfirmed :exec
UPDATE outbox_confirmed SET published_at = $2, id = $3 WHERE consumer = $1;

-- name: OutboxProgress :many
-- Where events are: published (when), and in the consumer's inbox or not.
SELECT o.id, o.published_at,
       EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = @consumer AND i.message_id = o.id) AS inboxed
FROM outbox o WHERE o.id = ANY(@ids::uuid[]);
