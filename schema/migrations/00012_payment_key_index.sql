-- +goose NO TRANSACTION
-- A payment by its idempotency key (GET /v1/payments?idempotency_key=, the sweeper): once
-- retention deletes records, a key may name several payments, the newest being the key's, so
-- the index carries the order too. Built concurrently: payments keep being written meanwhile.
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS payments_merchant_key;
CREATE INDEX CONCURRENTLY payments_merchant_key ON payments (merchant_id, idempotency_key, created_at, id);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS payments_merchant_key;
