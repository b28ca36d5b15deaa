-- +goose NO TRANSACTION
-- The start backlog (docs/operations.md, "Payday"): a payment accepted while workflows cannot
-- start as fast as payments arrive is queued on its record (queued, with no lease), and the
-- backlog's drainer starts it later, merchants in turn and each merchant's in arrival order.
-- Only queued records are in the new index, and a record that is never queued never changes the
-- column: a payment's own updates stay HOT.
-- backlog_state is the drainer's one row: what the API reads to refuse a payment the backlog
-- could not start within the clients' patience.
-- +goose Up
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS queued boolean NOT NULL DEFAULT false;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_queued;
CREATE INDEX CONCURRENTLY idempotency_queued ON idempotency_records (merchant_id, created_at, operation_id)
    WHERE queued;
CREATE TABLE IF NOT EXISTS backlog_state (
    id               int              PRIMARY KEY CHECK (id = 1),
    queued           bigint           NOT NULL,
    oldest           timestamptz,
    drain_per_second double precision NOT NULL,
    updated_at       timestamptz      NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS backlog_state;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_queued;
ALTER TABLE idempotency_records DROP COLUMN IF EXISTS queued;
