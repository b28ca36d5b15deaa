-- +goose NO TRANSACTION
-- Manual payments by when they last became unknown: reconciliation finds a capture settled after
-- the day it became unknown on without reading every posting since. Only the rare move into or
-- out of unknown changes it, so a payment's usual moves stay HOT. Built concurrently: payments
-- keep being written; a build that failed leaves an invalid index, which a rerun drops and
-- builds again.
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS payments_manual_unknown_at;
CREATE INDEX CONCURRENTLY payments_manual_unknown_at ON payments (unknown_at) WHERE capture_manual AND unknown_at IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS payments_manual_unknown_at;
