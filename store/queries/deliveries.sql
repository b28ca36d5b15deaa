-- Webhook deliveries and their attempt log. The sender claims a delivery only when no earlier
-- delivery of its aggregate is pending.

-- name: PurgeDeliveries :execrows
-- Finished deliveries only: a pending one is still owed to the merchant. Attempts cascade. A
-- row last changed before the cutoff was created before it too: that condition reads the
-- webhook_deliveries_finished index (migration 32) instead of the whole table. The status is
-- checked again on the row deleted: one redelivered after the subquery's snapshot (pending
-- again, owed to the merchant) is rechecked once its lock is released, and kept.
DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM webhook_deliveries
WHERE status IN ('delivered', 'failed', 'skipped') AND created_at < now() - $1::float8 * interval '1 second'
  AND updated_at < now() - $1::float8 * interval '1 second' LIMIT $2)
  AND status IN ('delivered', 'failed', 'skipped') AND updated_at < now() - $1::float8 * interval '1 second';

-- name: InsertAttempt :exec
INSERT INTO webhook_attempts (id, delivery_id, attempt, started_at, duration_ms, status_code, error)
VALUES ($1, $2, $3, $4, $5, NULLIF($6, 0), NULLIF($7, ''));

-- name: MarkDelivered :one
-- A 2xx wins whoever holds the lease now, and over a `failed` the takeover recorded, but a late
-- one (its lease ran out and another attempt took over) not over a redelivery made after its
-- claim (retry_base >= its attempt): the operator asked for a send after it. An attempt owns the
-- row only while it is claimed: an aborted attempt's number is taken again by the next claim
-- (AttemptAborted), and until then an earlier attempt that reports late with that number is stale.
UPDATE webhook_deliveries SET status = 'delivered', delivered_at = now(), claimed_until = NULL,
last_status_code = NULLIF($2, 0), last_error = NULL, updated_at = now()
WHERE id = $1 AND status <> 'delivered' AND ((attempts = $3 AND claimed_until IS NOT NULL) OR retry_base < $3)
RETURNING status, attempts;

-- name: AttemptFailed :one
-- A failure reschedules only if this attempt still owns the row (claimed, with its number); it gives up once the next
-- attempt would fall after the retry window. A redelivery asked for during this attempt
-- (retry_base = its number) is sent at once: the operator asked for a send after this one.
UPDATE webhook_deliveries SET
  status = CASE WHEN retry_base < $2
                 AND now() + $3::float8 * interval '1 second' > retry_since + $4::float8 * interval '1 second'
                THEN 'failed' ELSE 'pending' END,
  next_attempt_at = CASE WHEN retry_base >= $2 THEN now()
                         ELSE now() + $3::float8 * interval '1 second' END, claimed_until = NULL,
  last_status_code = NULLIF($5, 0), last_error = NULLIF($6, ''), updated_at = now()
WHERE id = $1 AND status = 'pending' AND attempts = $2 AND claimed_until IS NOT NULL RETURNING status, attempts;

-- name: AttemptAborted :one
-- An attempt its own sender cut short (shutting down) is undone, not failed: the delivery is due
-- again at once with the attempt count, and so the backoff step, it had before the claim, and its
-- last answer kept. A redelivery asked for during it starts its window at the next send. The next
-- claim takes the cut attempt's number (its fencing token): the cut attempt reports only this once.
UPDATE webhook_deliveries SET attempts = attempts - 1, retry_base = least(retry_base, attempts - 1),
  next_attempt_at = now(), claimed_until = NULL, updated_at = now()
WHERE id = $1 AND status = 'pending' AND attempts = $2 AND claimed_until IS NOT NULL RETURNING status, attempts;

-- name: MerchantExists :one
SELECT EXISTS (SELECT 1 FROM merchants WHERE id = $1);

-- name: MerchantDeliveries :many
SELECT d.id, d.merchant_id, d.aggregate_id, d.event_type, d.event_created_at, coalesce(d.url, ''), d.status,
d.attempts, d.next_attempt_at, d.claimed_until, d.retry_since, coalesce(d.last_status_code, 0), coalesce(d.last_error, ''),
d.created_at, d.updated_at, d.delivered_at FROM webhook_deliveries d WHERE d.merchant_id = $1 ORDER BY d.id DESC LIMIT $2;

-- name: GetDelivery :many
SELECT d.id, d.merchant_id, d.aggregate_id, d.event_type, d.event_created_at, coalesce(d.url, ''), d.status,
d.attempts, d.next_attempt_at, d.claimed_until, d.retry_since, coalesce(d.last_status_code, 0), coalesce(d.last_error, ''),
d.created_at, d.updated_at, d.delivered_at FROM webhook_deliveries d WHERE d.id = $1;

-- name: PaymentDeliveries :many
SELECT d.id, d.merchant_id, d.aggregate_id, d.event_type, d.event_created_at, coalesce(d.url, ''), d.status,
d.attempts, d.next_attempt_at, d.claimed_until, d.retry_since, coalesce(d.last_status_code, 0), coalesce(d.last_error, ''),
d.created_at, d.updated_at, d.delivered_at FROM webhook_deliveries d WHERE d.aggregate_id = $1 ORDER BY d.event_created_at, d.id;

-- name: AttemptsOf :many
SELECT delivery_id, attempt, started_at, duration_ms, coalesce(status_code, 0), coalesce(error, '')
FROM webhook_attempts WHERE delivery_id = ANY($1::uuid[]) ORDER BY delivery_id, attempt, started_at;

-- name: Redeliver :one
-- Redelivery sends the same event (same id and body) to the merchant's current URL, now, and
-- opens a new retry window, whose backoff starts again (the claim counts its attempts from
-- retry_base). A pending delivery keeps its lease: no second concurrent send. Pending, it is not
-- delivered: delivered_at is cleared (the earlier 2xx stays in the attempt log) until a new 2xx.
UPDATE webhook_deliveries d SET status = 'pending', url = m.webhook_url, next_attempt_at = now(), delivered_at = NULL,
claimed_until = CASE WHEN d.status = 'pending' THEN d.claimed_until END, retry_since = now(), retry_base = d.attempts,
updated_at = now()
FROM merchants m WHERE d.id = $1 AND m.id = d.merchant_id AND m.webhook_url IS NOT NULL RETURNING d.id;
