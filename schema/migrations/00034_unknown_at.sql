-- +goose NO TRANSACTION
-- When a payment last became unknown, kept once it is settled: kasa sent nothing to the bank for
-- that step after it, so a settlement file's charge window ends there (the booking window after
-- it), not when an operator or a later file settled it, which may be days later. An authorization
-- settled as found, waiting for its capture again, clears it: its capture is a new step.
-- Metadata only (nullable, no default). Only the rare move into or out of unknown writes it, so
-- the index of manual payments by it (reconciliation finds a capture settled after the day it
-- became unknown on, without reading every posting since) leaves a payment's usual moves HOT;
-- built concurrently, a build that failed leaves an invalid index, which a rerun drops and builds
-- again. Payments unknown now get the time they became unknown: their updated_at.
-- +goose Up
ALTER TABLE payments ADD COLUMN IF NOT EXISTS unknown_at timestamptz;
UPDATE payments p SET unknown_at = p.updated_at FROM idempotency_records r
WHERE r.status = 'unknown' AND r.operation_id = p.id AND p.status = 'unknown' AND p.unknown_at IS NULL;
UPDATE payments p SET unknown_at = p.updated_at FROM open_authorizations a
WHERE a.payment_id = p.id AND p.status = 'unknown' AND p.unknown_at IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS payments_manual_unknown_at;
CREATE INDEX CONCURRENTLY payments_manual_unknown_at ON payments (unknown_at) WHERE capture_manual AND unknown_at IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS payments_manual_unknown_at;
ALTER TABLE payments DROP COLUMN IF EXISTS unknown_at;
