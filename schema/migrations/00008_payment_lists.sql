-- +goose NO TRANSACTION
-- A merchant's payments, newest first (GET /v1/payments): keyset pages on (created_at, id),
-- read backwards along these indexes, so a page costs its own rows whatever the page number
-- and never sorts. The status filter has an index of its own: filtering the first one instead
-- would read every newer payment to find a rare status (unknown, processing). Both are built
-- concurrently, so payments keep being written while a large table is indexed; a build that
-- failed leaves an invalid index, which a rerun drops and builds again.
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS payments_merchant_created;
CREATE INDEX CONCURRENTLY payments_merchant_created ON payments (merchant_id, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS payments_merchant_status_created;
CREATE INDEX CONCURRENTLY payments_merchant_status_created ON payments (merchant_id, status, created_at, id);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS payments_merchant_status_created;
DROP INDEX CONCURRENTLY IF EXISTS payments_merchant_created;
