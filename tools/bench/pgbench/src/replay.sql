-- The replay lookup: one pgbench transaction is the single query that finds a finished payment's
-- idempotency record, with its stored answer, by (merchant, key). Over -D records=N completed
-- records of merchant -D merchant_id under the keys key_base .. key_base+N-1 (setup.sql).
-- pgbench variables hold numbers, not text, so the keys are 19-digit numbers where kasa's HTTP
-- bench sends 36-character UUIDs, and every record is one merchant's: the index has the same
-- depth, its entries are a little shorter. Run with -M prepared and the fixture schema as the
-- search_path. The "-- query:" line becomes store/queries' statement (see payment.sql).

\set k random(:key_base, :key_base + :records - 1)

-- query: GetRecord merchant_id k
\gset record_
