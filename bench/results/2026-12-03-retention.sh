#!/usr/bin/env bash
# Idempotency-record retention, measured: batched deletes (kasa's DeleteExpiredRecords statement,
# one batch per transaction) against dropping daily partitions of a table partitioned by a time
# derived from the key. Both tables hold N records spread evenly over DAYS days; the retention is
# 72h, so (DAYS-3)/DAYS of them have expired. For each layout: the record path's rate (pgbench,
# the record's three writes of a payment) alone and while retention runs, the deletion's time and
# rate, sizes before and after, and VACUUM's time and WAL afterwards.
#
# Usage: PGURI=postgres://postgres@127.0.0.1:55491/kasa N=2000000 bench/results/2026-12-03-retention.sh
# on a database migrated by `kasa migrate` (the records table must be empty).
set -euo pipefail
PGURI=${PGURI:?a database migrated by kasa migrate}
N=${N:-2000000}
DAYS=${DAYS:-6}
CLIENTS=${CLIENTS:-8}
SECS=${SECS:-30}
BATCH=${BATCH:-1000}
tmp=$(mktemp -d)
q() { psql "$PGURI" -v ON_ERROR_STOP=1 -qAtX "$@"; }
say() { printf '%s\n' "$*"; }

q <<SQL
CREATE OR REPLACE FUNCTION bench_uuid7(ts timestamptz) RETURNS uuid LANGUAGE sql VOLATILE AS \$\$
  SELECT (lpad(to_hex(floor(extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7' ||
          substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid \$\$;
-- The time a UUIDv7 key carries in its first 48 bits.
CREATE OR REPLACE FUNCTION bench_key_ts(k text) RETURNS timestamptz LANGUAGE sql IMMUTABLE AS \$\$
  SELECT to_timestamp(('x' || lpad(substr(replace(k, '-', ''), 1, 12), 16, '0'))::bit(64)::bigint / 1000.0) \$\$;
CREATE TABLE IF NOT EXISTS bench_merchants (n int PRIMARY KEY, id uuid NOT NULL);
INSERT INTO merchants (id, name, webhook_secret_enc)
SELECT gen_random_uuid(), 'bench ' || n, '\x00' FROM generate_series(0, 999) n;
INSERT INTO bench_merchants SELECT row_number() OVER () - 1, id FROM merchants;

-- The partitioned twin: daily range partitions on the key's time; the primary key must hold it.
CREATE TABLE idem_part (LIKE idempotency_records INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    key_ts timestamptz NOT NULL) PARTITION BY RANGE (key_ts);
ALTER TABLE idem_part ADD PRIMARY KEY (merchant_id, scope, idempotency_key, key_ts);
CREATE INDEX ON idem_part (operation_id);
CREATE INDEX ON idem_part (merchant_id, scope, created_at, operation_id) WHERE status <> 'completed';
DO \$\$
DECLARE d date;
BEGIN
  FOR d IN SELECT generate_series(current_date - $DAYS - 1, current_date + 2, interval '1 day')::date LOOP
    EXECUTE format('CREATE TABLE idem_part_%s PARTITION OF idem_part FOR VALUES FROM (%L) TO (%L)',
                   to_char(d, 'YYYYMMDD'), d, d + 1);
  END LOOP;
END \$\$;

-- The statement of store.DeleteExpiredRecords, one batch per transaction until none is left.
CREATE OR REPLACE PROCEDURE bench_retention(retention_seconds float8, max_rows int) LANGUAGE plpgsql AS \$\$
DECLARE after uuid := '00000000-0000-0000-0000-000000000000'; n int; total bigint := 0; t0 timestamptz;
BEGIN
  LOOP
    t0 := clock_timestamp();
    WITH cutoff AS (
      SELECT now() - retention_seconds * interval '1 second' AS at
    ), doomed AS (
      SELECT r.operation_id FROM idempotency_records r, cutoff
      WHERE r.operation_id > after
        AND r.operation_id < (lpad(to_hex((extract(epoch FROM cutoff.at) * 1000)::bigint), 12, '0')
                              || '00000000000000000000')::uuid
        AND r.status = 'completed' AND r.updated_at < cutoff.at
      ORDER BY r.operation_id LIMIT max_rows FOR UPDATE OF r SKIP LOCKED
    ), gone AS (
      DELETE FROM idempotency_records r USING doomed d WHERE r.operation_id = d.operation_id
      RETURNING r.operation_id
    )
    SELECT (SELECT count(*) FROM gone)::int,
           coalesce((SELECT d.operation_id FROM doomed d ORDER BY d.operation_id DESC LIMIT 1), after)
    INTO n, after;
    COMMIT;
    total := total + n;
    EXIT WHEN n < max_rows;
    -- As store.DeleteExpiredRecords: pause four times the batch's time before the next.
    PERFORM pg_sleep(4 * extract(epoch FROM clock_timestamp() - t0));
  END LOOP;
  RAISE NOTICE 'deleted %', total;
END \$\$;
SQL

load() { # table, extra column
  local t=$1 extra=$2 val=$3
  q <<SQL
INSERT INTO $t (merchant_id, scope, idempotency_key, request_hash, status, operation_id, outcome,
    response_body, locked_until, workflow_started, created_at, updated_at $extra)
SELECT m.id, 'payment', k, md5(k) || md5(k), 'completed', bench_uuid7(ts), 'succeeded',
    convert_to(rpad('{"id":"' || k || '","status":"succeeded"', 330, ' ') || '}', 'UTF8'),
    NULL, true, ts, ts + interval '1 second' $val
FROM (SELECT i, now() - interval '1 day' * $DAYS * i / $N AS ts FROM generate_series(1, $N) i) s
CROSS JOIN LATERAL (SELECT bench_uuid7(s.ts)::text AS k) kk
JOIN bench_merchants m ON m.n = s.i % 1000;
SQL
}

script() { # table, extra column, its value, extra condition -> pgbench file: the record's three writes of one payment
  cat > "$tmp/$1.sql" <<SQL
\set m random(0, 999)
SELECT bench_uuid7(now())::text AS k, bench_uuid7(now()) AS op \gset
INSERT INTO $1 (merchant_id, scope, idempotency_key, request_hash, status, operation_id, locked_until $2)
SELECT id, 'payment', :k, md5(:k) || md5(:k), 'processing', :op, now() + interval '1 minute' $3
FROM bench_merchants WHERE n = :m ON CONFLICT DO NOTHING;
UPDATE $1 SET workflow_started = true, locked_until = NULL, updated_at = now()
WHERE merchant_id = (SELECT id FROM bench_merchants WHERE n = :m) AND scope = 'payment' AND idempotency_key = :k $4;
UPDATE $1 SET status = 'completed', outcome = 'succeeded', response_body = convert_to(rpad('{"status":"succeeded"', 330, ' ') || '}', 'UTF8'), updated_at = now()
WHERE merchant_id = (SELECT id FROM bench_merchants WHERE n = :m) AND scope = 'payment' AND idempotency_key = :k $4;
SQL
}

tps() { pgbench "$PGURI" -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" -f "$tmp/$1.sql" 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p'; }
sizes() { # table: heap, indexes, dead tuples
  q -c "SELECT pg_size_pretty(sum(pg_table_size(c.oid))) || ' heap+toast, ' || pg_size_pretty(sum(pg_indexes_size(c.oid))) || ' indexes'
        FROM pg_class c WHERE c.relname = '$1' OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = '$1'::regclass)"
}
lsn() { q -c "SELECT pg_current_wal_lsn()"; }
walsince() { q -c "SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), '$1'))"; }
now_s() { date +%s.%N; }

say "## setup: N=$N records over $DAYS days, retention 72h, $CLIENTS pgbench clients, ${SECS}s runs, batch $BATCH"
t0=$(now_s); load idempotency_records "" ""; t1=$(now_s)
say "load (flat table): $(echo "$t1 - $t0" | bc) s"
load idem_part ", key_ts" ", bench_key_ts(k)"
q -c "VACUUM ANALYZE idempotency_records" -c "VACUUM ANALYZE idem_part" -c "CHECKPOINT"
script idempotency_records "" "" ""
# The partitioned table's keys are UUIDv7s here, so that the partition is derived from the key.
script idem_part ", key_ts" ", bench_key_ts(:k)" "AND key_ts = bench_key_ts(:k)"

say; say "## batched deletes (flat table, kasa's layout)"
say "expired: $(q -c "SELECT count(*) FROM idempotency_records WHERE status = 'completed' AND updated_at < now() - interval '72 hours'") of $(q -c 'SELECT count(*) FROM idempotency_records')"
say "before: $(sizes idempotency_records)"
say "record path alone: $(tps idempotency_records) tps"
w0=$(lsn); t0=$(now_s)
( psql "$PGURI" -qAtX -c "CALL bench_retention(259200, $BATCH)" > "$tmp/del.out" 2>&1; now_s > "$tmp/del.end" ) &
del=$!
sleep 1
say "record path while deleting: $(tps idempotency_records) tps"
wait $del
t1=$(cat "$tmp/del.end")
left=$(q -c "SELECT count(*) FROM idempotency_records WHERE status = 'completed' AND updated_at < now() - interval '72 hours'")
say "deletion: $(cat "$tmp/del.out" | tr '\n' ' ') in $(echo "$t1 - $t0" | bc) s; still expired: $left; WAL $(walsince "$w0")"
say "after delete: $(sizes idempotency_records); dead tuples $(q -c "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'idempotency_records'")"
say "EXPLAIN of one batch:"
q -c "EXPLAIN (COSTS OFF) WITH cutoff AS (SELECT now() - interval '72 hours' AS at), doomed AS (
      SELECT r.operation_id FROM idempotency_records r, cutoff WHERE r.operation_id > '00000000-0000-0000-0000-000000000000'
        AND r.operation_id < (lpad(to_hex((extract(epoch FROM cutoff.at) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid
        AND r.status = 'completed' AND r.updated_at < cutoff.at ORDER BY r.operation_id LIMIT 1000 FOR UPDATE OF r SKIP LOCKED)
      DELETE FROM idempotency_records r USING doomed d WHERE r.operation_id = d.operation_id" | sed 's/^/    /'
w0=$(lsn); t0=$(now_s)
q -c "VACUUM idempotency_records"
t1=$(now_s)
say "VACUUM afterwards: $(echo "$t1 - $t0" | bc) s, WAL $(walsince "$w0"); after: $(sizes idempotency_records)"
say "record path after vacuum: $(tps idempotency_records) tps"

say; say "## dropping daily partitions (partitioned twin)"
old=$(q -c "SELECT string_agg(c.relname, ' ' ORDER BY c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = 'idem_part'::regclass AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1 <= (now() - interval '72 hours')::date")
say "partitions wholly older than 72h: $old"
say "before: $(sizes idem_part)"
say "record path alone: $(tps idem_part) tps"
w0=$(lsn); t0=$(now_s)
( for p in $old; do psql "$PGURI" -qAtX -c "ALTER TABLE idem_part DETACH PARTITION $p CONCURRENTLY" -c "DROP TABLE $p"; done; now_s > "$tmp/drop.end" ) &
drop=$!
sleep 1
say "record path while dropping: $(tps idem_part) tps"
wait $drop
t1=$(cat "$tmp/drop.end")
say "drop: $(echo "$t1 - $t0" | bc) s; WAL $(walsince "$w0"); after: $(sizes idem_part); still expired (in the partition that straddles the cut-off): $(q -c "SELECT count(*) FROM idem_part WHERE updated_at < now() - interval '72 hours'")"
rm -rf "$tmp"
