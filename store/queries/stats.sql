-- Health figures read at scrape time.

-- name: Stats :one
SELECT
  (SELECT count(*) FROM payments WHERE status = 'unknown'),
  (SELECT coalesce(min(at), 'epoch') FROM (
     SELECT min(updated_at) AS at FROM payments WHERE status = 'unknown'
     UNION ALL SELECT min(updated_at) FROM refunds WHERE status = 'unknown') oldest),
  (SELECT count(*) FROM outbox WHERE published_at IS NULL),
  (SELECT coalesce(min(created_at), 'epoch') FROM outbox WHERE published_at IS NULL),
  (SELECT count(*) FROM payments WHERE stuck_since IS NOT NULL
     OR (status = 'processing' AND created_at < now() - $1::float8 * interval '1 second')),
  (SELECT count(*) FROM refunds WHERE status = 'unknown'),
  (SELECT count(*) FROM refunds WHERE stuck_since IS NOT NULL
     OR (status = 'processing' AND created_at < now() - $1::float8 * interval '1 second'));

-- name: HotAccount :one
-- Entry ids are UUIDv7: the last minute is a primary-key range, however large the ledger.
SELECT coalesce(max(n), 0), coalesce(sum(n), 0)
FROM (SELECT count(*) AS n FROM ledger_entries WHERE id >= $1 GROUP BY account_id) per_account;
