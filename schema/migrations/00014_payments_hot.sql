-- +goose NO TRANSACTION
-- No index of payments names a column that a payment's success changes (status,
-- provider_reference, updated_at, charge_attempts, the refund columns), so processing ->
-- succeeded is updated in place (HOT) instead of writing a new entry into every index.
--   - The business key covers the live payments by failure_code IS NULL, which the CHECK
--     payments_failure makes the same as status IN ('processing', 'unknown', 'succeeded'); it
--     keeps its name, which errors are translated by.
--   - The open payments (processing, unknown) are found through their idempotency records,
--     which follow them (kasa verify checks it) and are never deleted while open:
--     idempotency_open lists a merchant's open records newest first and serves the lists of
--     processing and unknown payments, the health figures and the sweeper. It replaces
--     idempotency_unstarted, so starting the workflow is a HOT update of the record and its
--     completion is the one that is not.
--   - Failed payments have their own list index; the failure is a non-HOT update anyway.
-- The new indexes are built concurrently before the old ones go, so payments keep being
-- written and every query keeps an index meanwhile; a build that failed leaves an invalid
-- index, which a rerun drops and builds again. The business key is swapped in one short
-- transaction, so a unique index named payments_business_key guards the invoices throughout.
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS idempotency_open;
CREATE INDEX CONCURRENTLY idempotency_open ON idempotency_records (merchant_id, scope, created_at, operation_id)
    WHERE status <> 'completed';
DROP INDEX CONCURRENTLY IF EXISTS payments_merchant_failed;
CREATE INDEX CONCURRENTLY payments_merchant_failed ON payments (merchant_id, created_at, id)
    WHERE failure_code IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS payments_business_key_next;
CREATE UNIQUE INDEX CONCURRENTLY payments_business_key_next ON payments (merchant_id, invoice_id, payment_type)
    WHERE failure_code IS NULL;
-- +goose StatementBegin
DO $$
BEGIN
    SET LOCAL lock_timeout = '1s';
    DROP INDEX payments_business_key;
    ALTER INDEX payments_business_key_next RENAME TO payments_business_key;
END $$;
-- +goose StatementEnd
DROP INDEX CONCURRENTLY IF EXISTS payments_merchant_status_created;
DROP INDEX CONCURRENTLY IF EXISTS payments_unknown;
DROP INDEX CONCURRENTLY IF EXISTS payments_processing;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_unstarted;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_unstarted;
CREATE INDEX CONCURRENTLY idempotency_unstarted ON idempotency_records (locked_until) WHERE NOT workflow_started;
DROP INDEX CONCURRENTLY IF EXISTS payments_processing;
CREATE INDEX CONCURRENTLY payments_processing ON payments (created_at) WHERE status = 'processing';
DROP INDEX CONCURRENTLY IF EXISTS payments_unknown;
CREATE INDEX CONCURRENTLY payments_unknown ON payments (updated_at) WHERE status = 'unknown';
DROP INDEX CONCURRENTLY IF EXISTS payments_merchant_status_created;
CREATE INDEX CONCURRENTLY payments_merchant_status_created ON payments (merchant_id, status, created_at, id);
DROP INDEX CONCURRENTLY IF EXISTS payments_business_key_next;
CREATE UNIQUE INDEX CONCURRENTLY payments_business_key_next ON payments (merchant_id, invoice_id, payment_type)
    WHERE status IN ('processing', 'unknown', 'succeeded');
-- +goose StatementBegin
DO $$
BEGIN
    SET LOCAL lock_timeout = '1s';
    DROP INDEX payments_business_key;
    ALTER INDEX payments_business_key_next RENAME TO payments_business_key;
END $$;
-- +goose StatementEnd
DROP INDEX CONCURRENTLY IF EXISTS payments_merchant_failed;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_open;
