-- +goose Up
-- A merchant may hold several API keys at once (rotation without downtime); a revoked key stays,
-- with revoked_at, so that its id keeps meaning something in the operators' records. Only each
-- key's SHA-256 is stored.
CREATE TABLE api_keys (
    id          uuid        PRIMARY KEY,
    merchant_id uuid        NOT NULL REFERENCES merchants (id),
    key_hash    bytea       NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_merchant ON api_keys (merchant_id);

-- Existing merchants keep their key, under a UUIDv7 taken from the merchant's creation time.
INSERT INTO api_keys (id, merchant_id, key_hash, created_at)
SELECT encode(set_byte(overlay(uuid_send(gen_random_uuid())
           PLACING substring(int8send(floor(extract(epoch FROM created_at) * 1000)::bigint) FROM 3) FROM 1 FOR 6),
           6, (get_byte(uuid_send(gen_random_uuid()), 6) & 15) | 112), 'hex')::uuid,
       id, api_key_hash, created_at
FROM merchants;
-- One place says which keys are valid: a hash left here would outlive its key's revocation.
ALTER TABLE merchants DROP COLUMN api_key_hash;

-- A rotated webhook secret keeps signing next to the new one until webhook_secret_prev_until,
-- so that receivers can switch without dropping a webhook. Encrypted like the current one.
ALTER TABLE merchants
    ADD COLUMN webhook_secret_prev_enc   bytea,
    ADD COLUMN webhook_secret_prev_until timestamptz,
    ADD CONSTRAINT merchants_webhook_secret_prev
        CHECK ((webhook_secret_prev_enc IS NULL) = (webhook_secret_prev_until IS NULL));

-- +goose Down
ALTER TABLE merchants DROP CONSTRAINT merchants_webhook_secret_prev,
    DROP COLUMN webhook_secret_prev_until, DROP COLUMN webhook_secret_prev_enc;
-- Each merchant gets back its oldest live key; one without any gets a hash no key has.
ALTER TABLE merchants ADD COLUMN api_key_hash bytea;
UPDATE merchants m SET api_key_hash = (SELECT k.key_hash FROM api_keys k
    WHERE k.merchant_id = m.id AND k.revoked_at IS NULL ORDER BY k.id LIMIT 1);
UPDATE merchants SET api_key_hash = sha256(uuid_send(gen_random_uuid())) WHERE api_key_hash IS NULL;
ALTER TABLE merchants ALTER COLUMN api_key_hash SET NOT NULL,
    ADD CONSTRAINT merchants_api_key_hash_key UNIQUE (api_key_hash);
DROP TABLE api_keys;
