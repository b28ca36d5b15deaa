-- The fixture of the minimal sketch (minimal.sql), run by psql in one transaction (psql -1) with
-- the same variables as setup.sql. It creates a private schema with the fewest tables the seed's
-- design needs for a payment, and only what keeps money safe: primary keys, the funds CHECK. No
-- foreign keys, no triggers, one secondary index (the relay's), no payments table: the floor kasa is compared to.

CREATE SCHEMA :"schema";
SET LOCAL search_path = :"schema";

CREATE TABLE accounts (
    id       uuid   PRIMARY KEY,
    balance  bigint NOT NULL,
    reserved bigint NOT NULL DEFAULT 0,
    CHECK (reserved >= 0 AND balance - reserved >= 0)
);

CREATE TABLE idempotency_records (
    merchant_id     uuid        NOT NULL,
    idempotency_key text        NOT NULL,
    request_hash    text        NOT NULL,
    status          text        NOT NULL,
    operation_id    uuid        NOT NULL,
    response_body   bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, idempotency_key)
);

CREATE TABLE ledger_entries (
    id           uuid        PRIMARY KEY,
    operation_id uuid        NOT NULL,
    account_id   uuid        NOT NULL,
    amount_minor bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE outbox (
    id           uuid        PRIMARY KEY,
    aggregate_id uuid        NOT NULL,
    type         text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
-- The one secondary index: a relay must find the unpublished rows without reading them all.
CREATE INDEX outbox_unpublished ON outbox (created_at) WHERE published_at IS NULL;

-- UUIDv7, as setup.sql makes them.
CREATE FUNCTION uuid7() RETURNS uuid LANGUAGE sql VOLATILE AS $f$
    SELECT encode(set_byte(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3) FROM 1 FOR 6),
        6, (get_byte(uuid_send(gen_random_uuid()), 6) & 15) | 112), 'hex')::uuid
$f$;

-- The same ids as setup.sql: merchant n's settlement account md5('settlement/n') and its payers
-- md5('payer/n/p'), funded far beyond any run.
INSERT INTO accounts (id, balance)
SELECT md5('settlement/' || n)::uuid, 0 FROM generate_series(1, :merchants) n;
INSERT INTO accounts (id, balance)
SELECT md5('payer/' || n || '/' || p)::uuid, 1000000000000000
FROM generate_series(1, :merchants) n, generate_series(1, :payers) p;

ANALYZE accounts;
