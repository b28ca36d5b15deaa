-- An operator's Idempotency-Key on POST /admin/v1/accounts (per merchant, as a deposit's is per
-- account) and /admin/v1/merchants: the key names the account or merchant it created for good, so
-- a retried creation makes no second one (the primary key decides between concurrent requests). A merchant's creation also keeps its answer's
-- secrets, sealed with KASA_SECRET_KEY as the webhook secret is, until the idempotency retention
-- wipes them (answer_enc NULL); its request hash tells a replay from another request. A few rows
-- per merchant. The foreign keys take a short lock on accounts and merchants: it gives up after
-- 1 s rather than queue payments behind it (kasa migrate tries again later).
-- +goose Up
SET LOCAL lock_timeout = '1s';
CREATE TABLE IF NOT EXISTS account_creations (
    merchant_id     uuid        NOT NULL,
    idempotency_key text        NOT NULL,
    account_id      uuid        NOT NULL UNIQUE REFERENCES accounts (id) DEFERRABLE INITIALLY DEFERRED,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, idempotency_key)
);
CREATE TABLE IF NOT EXISTS merchant_creations (
    idempotency_key text        PRIMARY KEY,
    merchant_id     uuid        NOT NULL UNIQUE REFERENCES merchants (id) DEFERRABLE INITIALLY DEFERRED,
    api_key_id      uuid        NOT NULL,
    request_hash    bytea       NOT NULL,
    answer_enc      bytea,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS merchant_creations_kept ON merchant_creations (created_at) WHERE answer_enc IS NOT NULL;

-- +goose Down
DROP TABLE IF EXISTS merchant_creations;
DROP TABLE IF EXISTS account_creations;
