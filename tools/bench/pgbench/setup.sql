-- The fixture of kasa's pgbench scripts, run by psql in one transaction (psql -1) with the
-- variables schema, merchants, payers, records and key_base. It never touches kasa's own tables:
-- it creates a private schema holding a clone of every table one payment touches, and fills it.
--
-- CREATE TABLE .. (LIKE .. INCLUDING ALL) copies columns, defaults, NOT NULL and CHECK
-- constraints and every index (primary key, unique, partial), but neither foreign keys nor
-- triggers. Both are part of a payment's real cost (an FK check locks the referenced row FOR KEY
-- SHARE; the ledger_entries_balanced trigger sums the posting once per statement), so the DO
-- block below copies them from the catalog too, pointed at the clones. Trigger functions stay in
-- public and resolve their unqualified table names through the session's search_path, which is
-- the fixture schema in every pgbench session.

CREATE SCHEMA :"schema";
-- Only the fixture schema is visible from here on: an unqualified name that is not a clone is an
-- error, never a write to kasa's tables.
SET LOCAL search_path = :"schema";

DO $$
DECLARE
    s      text   := current_schema();
    tables text[] := ARRAY['merchants', 'api_keys', 'accounts', 'settlement_shards', 'idempotency_records', 'payments',
                           'balance_reservations', 'ledger_postings', 'ledger_entries', 'outbox'];
    t      text;
    r      record;
BEGIN
    IF s IS NULL OR s = 'public' THEN
        RAISE EXCEPTION 'fixture schema missing from search_path';
    END IF;
    FOREACH t IN ARRAY tables LOOP
        EXECUTE format('CREATE TABLE %I.%I (LIKE public.%I INCLUDING ALL)', s, t, t);
    END LOOP;
    -- public is not on the search_path, so the definitions name public.x: point them at the clones.
    FOR r IN
        SELECT c.conrelid::regclass AS rel, c.conname, pg_get_constraintdef(c.oid) AS def
        FROM pg_constraint c
        WHERE c.contype = 'f' AND c.conrelid = ANY (SELECT ('public.' || quote_ident(x))::regclass FROM unnest(tables) x)
        ORDER BY c.conrelid::regclass::text, c.conname
    LOOP
        EXECUTE format('ALTER TABLE %I.%I ADD CONSTRAINT %I %s', s, (SELECT relname FROM pg_class WHERE oid = r.rel),
            r.conname, regexp_replace(r.def, 'REFERENCES public\.', 'REFERENCES ' || quote_ident(s) || '.'));
    END LOOP;
    FOR r IN
        SELECT pg_get_triggerdef(g.oid) AS def
        FROM pg_trigger g
        WHERE NOT g.tgisinternal AND g.tgrelid = ANY (SELECT ('public.' || quote_ident(x))::regclass FROM unnest(tables) x)
        ORDER BY g.tgrelid::regclass::text, g.tgname
    LOOP
        EXECUTE regexp_replace(r.def, ' ON public\.', ' ON ' || quote_ident(s) || '.');
    END LOOP;
END;
$$;

-- kasa mints UUIDv7 ids (payment.NewID): time-ordered, so inserts land at the right edge of the
-- indexes. PostgreSQL 15 has only v4; this makes the same layout (48-bit milliseconds first).
CREATE FUNCTION uuid7() RETURNS uuid LANGUAGE sql VOLATILE AS $f$
    SELECT encode(set_byte(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6),
        6, (get_byte(uuid_send(gen_random_uuid()), 6) & 15) | 112), 'hex')::uuid
$f$;

-- Merchant n: id md5('merchant/n'), API key 'sk_bench_n'; its payers (customer accounts, funded
-- far beyond any run) md5('payer/n/p') and its settlement account md5('settlement/n'), in TRY.
-- The scripts derive the same values from the numbers.
INSERT INTO merchants (id, name, webhook_url, webhook_secret_enc)
SELECT md5('merchant/' || n)::uuid, 'bench-' || n, NULL, '\x00'::bytea
FROM generate_series(1, :merchants) n;

INSERT INTO api_keys (id, merchant_id, key_hash)
SELECT uuid7(), md5('merchant/' || n)::uuid, sha256(convert_to('sk_bench_' || n, 'UTF8'))
FROM generate_series(1, :merchants) n;

INSERT INTO accounts (id, merchant_id, kind, currency, balance)
SELECT md5('settlement/' || n)::uuid, md5('merchant/' || n)::uuid, 'settlement', 'TRY', 0
FROM generate_series(1, :merchants) n;

INSERT INTO accounts (id, merchant_id, kind, currency, balance)
SELECT md5('payer/' || n || '/' || p)::uuid, md5('merchant/' || n)::uuid, 'customer', 'TRY', 1000000000000000
FROM generate_series(1, :merchants) n, generate_series(1, :payers) p;

-- The finished payments a replay looks up: merchant 1's records under the keys key_base ..
-- key_base+records-1, completed, with a stored 201 answer the size of a payment resource.
INSERT INTO idempotency_records (merchant_id, idempotency_key, request_hash, status, operation_id,
    outcome, response_body, locked_until, workflow_started)
SELECT md5('merchant/1')::uuid, k::text, encode(sha256(convert_to(k::text, 'UTF8')), 'hex'), 'completed', op,
    'succeeded', convert_to(json_build_object('id', op, 'status', 'succeeded', 'amount', '100.00', 'currency', 'TRY',
        'invoice_id', k::text, 'payment_type', 'purchase', 'account_id', md5('payer/1/1')::uuid,
        'failure_code', NULL, 'provider_reference', 'ch_' || op,
        'created_at', now(),
        'updated_at', now())::text, 'UTF8'),
    NULL, true
FROM (SELECT :key_base::bigint + i AS k, uuid7() AS op FROM generate_series(0, :records - 1) i) x;

ANALYZE merchants, api_keys, accounts, idempotency_records;
