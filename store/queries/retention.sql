-- Idempotency-record retention: the records of finished operations are deleted once they have
-- been finished for longer than the retention; open ones (processing, unknown) are kept, and so
-- are those of manual payments still waiting for their capture (answered, but not finished).

-- name: DeleteExpiredRecords :one
-- One batch, oldest operations first, from after the previous batch's last operation id. The
-- operation id is a UUIDv7 minted when the request arrived, so an operation that finished before
-- the cut-off began before it too: the unique index on operation_id, bounded by the cut-off's
-- UUIDv7 prefix, finds the candidates without an index of its own (one more index entry for
-- every completion to write). SKIP LOCKED lets several workers delete side by side, each
-- taking rows the others have not locked, and lets a request racing on the same key go first.
WITH cutoff AS (
  SELECT now() - sqlc.arg(retention_seconds)::float8 * interval '1 second' AS at
), doomed AS (
  SELECT r.operation_id FROM idempotency_records r, cutoff
  WHERE r.operation_id > sqlc.arg(after)::uuid
    AND r.operation_id < (lpad(to_hex((extract(epoch FROM cutoff.at) * 1000)::bigint), 12, '0')
                          || '00000000000000000000')::uuid
    AND r.status = 'completed' AND r.updated_at < cutoff.at
    AND NOT EXISTS (SELECT 1 FROM open_authorizations a WHERE a.payment_id = r.operation_id)
  ORDER BY r.operation_id
  LIMIT sqlc.arg(max_rows)
  FOR UPDATE OF r SKIP LOCKED
), gone AS (
  DELETE FROM idempotency_records r USING doomed d WHERE r.operation_id = d.operation_id
  RETURNING r.operation_id
)
SELECT (SELECT count(*) FROM gone)::int AS deleted,
       coalesce((SELECT d.operation_id FROM doomed d ORDER BY d.operation_id DESC LIMIT 1),
                '00000000-0000-0000-0000-000000000000'::uuid)::uuid AS last;

-- name: SeeRetention :exec
-- A deleter announces the retention it deletes records by.
INSERT INTO record_retentions (retention_ms) VALUES (@retention_ms)
ON CONFLICT (retention_ms) DO UPDATE SET last_seen = now();

-- name: ShortestRetentionMS :one
-- The shortest retention a deleter announced within the last @live_seconds (0: none did), and
-- the database's clock, by which the deleters expire records.
SELECT coalesce(min(retention_ms), 0)::bigint AS shortest_ms, now()::timestamptz AS now FROM record_retentions
WHERE last_seen >= now() - sqlc.arg(live_seconds)::float8 * interval '1 second';
