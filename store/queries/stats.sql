-- Health figures read at scrape time.

-- name: Stats :one
-- The open payments (processing, unknown) are read through their open idempotency records,
-- which follow them: payments has no index naming the status, so that a payment's success is
-- updated in place. Each open record's payment is looked up by id (the LIMIT keeps the
-- planner from joining otherwise), so the figures cost what the few open records do, however
-- many payments finished. A manual payment's open authorization is open too: its record was
-- completed when it was authorized, and its capture or void may be unknown.
WITH open_payments AS (
  SELECT p.id, p.status, p.created_at, p.updated_at
  FROM idempotency_records r
  CROSS JOIN LATERAL (SELECT id, status, created_at, updated_at FROM payments WHERE id = r.operation_id LIMIT 1) p
  WHERE r.status <> 'completed' AND r.scope = 'payment'
  UNION
  SELECT p.id, p.status, p.created_at, p.updated_at
  FROM open_authorizations a
  CROSS JOIN LATERAL (SELECT id, status, created_at, updated_at FROM payments WHERE id = a.payment_id LIMIT 1) p
)
SELECT
  (SELECT count(*) FROM open_payments WHERE status = 'unknown'),
  (SELECT coalesce(min(at), 'epoch') FROM (
     SELECT min(updated_at) AS at FROM open_payments WHERE status = 'unknown'
     UNION ALL SELECT min(updated_at) FROM refunds WHERE status = 'unknown') oldest),
  (SELECT count(*) FROM outbox WHERE published_at IS NULL),
  (SELECT coalesce(min(created_at), 'epoch') FROM outbox WHERE published_at IS NULL),
  (SELECT count(*) FROM (
     SELECT id FROM payments WHERE stuck_since IS NOT NULL
     UNION SELECT id FROM open_payments WHERE status = 'processing' AND created_at < now() - $1::float8 * interval '1 second') stuck),
  (SELECT count(*) FROM refunds WHERE status = 'unknown'),
  (SELECT count(*) FROM refunds WHERE stuck_since IS NOT NULL
     OR (status = 'processing' AND created_at < now() - $1::float8 * interval '1 second')),
  (SELECT count(*) FROM open_authorizations),
  -- An authorization still open a minute after its capture_before: its void is late or unknown.
  (SELECT count(*) FROM open_authorizations WHERE capture_before < now() - interval '1 minute'),
  now()::timestamptz;

-- name: HotAccount :one
-- Entry ids are UUIDv7: the last minute is a primary-key range, however large the ledger.
SELECT coalesce(max(n), 0), coalesce(sum(n), 0)
FROM (SELECT count(*) AS n FROM ledger_entries WHERE id >= $1 GROUP BY account_id) per_account;
