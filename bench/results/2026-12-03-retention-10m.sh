#!/usr/bin/env bash
# Retention at 10 M records: the record path's rate alone, while a 5 M backlog is deleted, and after.
# Run after 2026-12-03-retention.sh N=10000000 on the same database (it defines bench_uuid7,
# bench_merchants and bench_retention, and leaves 5 M unexpired records); reloads 5 M expired ones.
set -euo pipefail
PGURI=${PGURI:-postgres://postgres@127.0.0.1:55491/kasa}
q() { psql "$PGURI" -v ON_ERROR_STOP=1 -qAtX "$@"; }
cat > ${TMPDIR:-/tmp}/rec.sql <<'SQL'
\set m random(0, 999)
SELECT bench_uuid7(now())::text AS k, bench_uuid7(now()) AS op \gset
INSERT INTO idempotency_records (merchant_id, scope, idempotency_key, request_hash, status, operation_id, locked_until)
SELECT id, 'payment', :k, md5(:k) || md5(:k), 'processing', :op, now() + interval '1 minute'
FROM bench_merchants WHERE n = :m ON CONFLICT DO NOTHING;
UPDATE idempotency_records SET workflow_started = true, locked_until = NULL, updated_at = now()
WHERE merchant_id = (SELECT id FROM bench_merchants WHERE n = :m) AND scope = 'payment' AND idempotency_key = :k;
UPDATE idempotency_records SET status = 'completed', outcome = 'succeeded', response_body = convert_to(rpad('{"status":"succeeded"', 330, ' ') || '}', 'UTF8'), updated_at = now()
WHERE merchant_id = (SELECT id FROM bench_merchants WHERE n = :m) AND scope = 'payment' AND idempotency_key = :k;
SQL
tps() { pgbench "$PGURI" -n -M prepared -c 8 -j 2 -T 30 -f ${TMPDIR:-/tmp}/rec.sql 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p'; }
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$(date +%s)
q <<SQL
INSERT INTO idempotency_records (merchant_id, scope, idempotency_key, request_hash, status, operation_id, outcome,
    response_body, locked_until, workflow_started, created_at, updated_at)
SELECT m.id, 'payment', k, md5(k) || md5(k), 'completed', bench_uuid7(ts), 'succeeded',
    convert_to(rpad('{"id":"' || k || '","status":"succeeded"', 330, ' ') || '}', 'UTF8'),
    NULL, true, ts, ts + interval '1 second'
FROM (SELECT i, now() - interval '73 hours' - interval '71 hours' * i / 5000000 AS ts FROM generate_series(1, 5000000) i) s
CROSS JOIN LATERAL (SELECT bench_uuid7(s.ts)::text AS k) kk
JOIN bench_merchants m ON m.n = s.i % 1000;
SQL
echo "loaded 5 M expired in $(( $(date +%s) - t0 )) s"
q -c "VACUUM ANALYZE idempotency_records" -c "CHECKPOINT"
echo "records: $(q -c 'SELECT count(*) FROM idempotency_records'), expired: $(q -c "SELECT count(*) FROM idempotency_records WHERE status = 'completed' AND updated_at < now() - interval '72 hours'")"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "record path alone: $(tps) tps"
echo "record path alone: $(tps) tps"
w0=$(q -c "SELECT pg_current_wal_lsn()"); t0=$(date +%s.%N)
( psql "$PGURI" -qAtX -c "CALL bench_retention(259200, 1000)" > ${TMPDIR:-/tmp}/del.out 2>&1; date +%s.%N > ${TMPDIR:-/tmp}/del.end ) &
del=$!
sleep 1
echo "record path while deleting: $(tps) tps"
echo "record path while deleting: $(tps) tps"
echo "record path while deleting: $(tps) tps"
wait $del
echo "deletion: $(tr '\n' ' ' < ${TMPDIR:-/tmp}/del.out) in $(echo "$(cat ${TMPDIR:-/tmp}/del.end) - $t0" | bc) s; WAL $(q -c "SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), '$w0'))")"
echo "still expired: $(q -c "SELECT count(*) FROM idempotency_records WHERE status = 'completed' AND updated_at < now() - interval '72 hours'")"
echo "record path after: $(tps) tps"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
