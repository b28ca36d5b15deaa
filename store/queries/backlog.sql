-- The start backlog: payments accepted while workflows could not start as fast as they arrived,
-- queued on their records for the drainer (docs/operations.md, "Payday").

-- name: ClaimQueued :many
-- Takes the oldest @per_merchant queued payments of each of up to @merchants merchants, the
-- merchants after @after in id order (the drainer's turn), leases them to the drainer, and
-- returns their payments, which the workflows start with. A claimed payment stays queued until
-- its workflow's first step takes it off (no statement of the drainer's own): a merchant's new
-- payment still queues behind it, and should the drainer die before starting it, or the start
-- not reach that step within the lease, the next claim takes it again (a second start of a run
-- starts nothing). The record keeps that a drainer claimed it (DrainedProcessing). The merchants
-- are found by skipping through the queued index, one probe each, past claimed ones. Only
-- payments are ever queued.
WITH RECURSIVE m AS (
  SELECT (SELECT r.merchant_id FROM idempotency_records r WHERE r.queued AND r.merchant_id > @after::uuid
          AND (r.locked_until IS NULL OR r.locked_until < now()) ORDER BY r.merchant_id LIMIT 1) AS merchant_id, 1 AS n
  UNION ALL
  SELECT (SELECT r.merchant_id FROM idempotency_records r WHERE r.queued AND r.merchant_id > m.merchant_id
          AND (r.locked_until IS NULL OR r.locked_until < now()) ORDER BY r.merchant_id LIMIT 1), m.n + 1
  FROM m WHERE m.merchant_id IS NOT NULL AND m.n < @merchants::int
), picked AS (
  SELECT q.merchant_id, q.scope, q.idempotency_key, q.operation_id FROM m CROSS JOIN LATERAL (
    SELECT r.merchant_id, r.scope, r.idempotency_key, r.operation_id FROM idempotency_records r
    WHERE r.queued AND r.merchant_id = m.merchant_id AND r.scope = 'payment'
      AND (r.locked_until IS NULL OR r.locked_until < now()) -- not claimed, or its claimer gone
    ORDER BY r.created_at, r.operation_id
    LIMIT @per_merchant::int FOR UPDATE SKIP LOCKED) q
)
UPDATE idempotency_records r SET locked_until = now() + @lease::interval, drained = true, updated_at = now()
FROM picked p JOIN payments ON payments.id = p.operation_id
WHERE r.merchant_id = p.merchant_id AND r.scope = p.scope AND r.idempotency_key = p.idempotency_key
RETURNING payments.*;

-- name: Unclaim :exec
-- Puts claimed payments whose start failed back in their queue, unleased, in their place.
UPDATE idempotency_records SET locked_until = NULL, updated_at = now()
WHERE operation_id = ANY(@ids::uuid[]) AND queued AND NOT workflow_started;

-- name: Unqueue :exec
-- Takes payments whose start failed for a reason of their own off their queue, their lease over:
-- the sweeper tries them from now on, and their merchant's queue goes on. No drainer started them.
UPDATE idempotency_records SET queued = false, drained = false, locked_until = now(), updated_at = now()
WHERE operation_id = ANY(@ids::uuid[]) AND queued AND NOT workflow_started;

-- name: StillProcessing :many
-- Which of the drainer's started payments are still processing: the ones it counts as running.
-- One flagged stuck waits for an operator, not for the cluster, so it holds no slot.
SELECT id FROM payments WHERE id = ANY(@ids::uuid[]) AND status = 'processing' AND stuck_since IS NULL;

-- name: DrainedProcessing :many
-- The payments a drainer claimed and started (off the queue: their first step ran) that are still
-- processing and not flagged stuck: a drainer that takes the lead counts them as the last leader's
-- running ones. Read once per lead, through the open records' index.
SELECT payments.* FROM idempotency_records r JOIN payments ON payments.id = r.operation_id
WHERE r.status <> 'completed' AND r.scope = 'payment' AND r.drained AND NOT r.queued
  AND payments.status = 'processing' AND payments.stuck_since IS NULL;

-- name: QueuedLeased :one
-- Whether a queued payment is still leased: claimed by a drainer and neither started yet (its
-- workflow's first step takes it off the queue) nor put back.
SELECT EXISTS (SELECT 1 FROM idempotency_records WHERE queued AND locked_until >= now());

-- name: QueuedBacklog :one
SELECT count(*) AS queued, coalesce(min(created_at), 'epoch')::timestamptz AS oldest, now()::timestamptz AS now
FROM idempotency_records WHERE queued;

-- name: SaveBacklogState :exec
INSERT INTO backlog_state (id, queued, oldest, drain_per_second, updated_at)
VALUES (1, @queued, @oldest, @drain_per_second, now())
ON CONFLICT (id) DO UPDATE SET queued = excluded.queued, oldest = excluded.oldest,
  drain_per_second = excluded.drain_per_second, updated_at = now();

-- name: GetBacklogState :one
SELECT queued, oldest, drain_per_second, updated_at, now()::timestamptz AS now FROM backlog_state WHERE id = 1;

-- name: TryLead :one
-- A session advisory lock: one holder across every process, let go when its session ends.
SELECT pg_try_advisory_lock(@key::bigint);

-- name: Unlead :exec
SELECT pg_advisory_unlock(@key::bigint);

-- name: ProcessingRecords :one
-- Operations not yet final nor unknown: queued, or started and running. It reads the whole
-- table: for the benchmark's occasional reads, not for a path that runs often.
SELECT count(*) FROM idempotency_records WHERE status = 'processing';

-- name: MerchantQueued :one
SELECT EXISTS (SELECT 1 FROM idempotency_records WHERE merchant_id = $1 AND queued);

-- name: SetSessionIdleTimeout :exec
-- Ends this session once idle that long (0: never), where the server has the setting
-- (PostgreSQL 14 on): a lock it holds is let go with it.
SELECT CASE WHEN current_setting('server_version_num')::int >= 140000
    THEN set_config('idle_session_timeout', (@timeout_ms::bigint)::text, false) END;
