-- When a payment or refund last became unknown, kept once it is settled: kasa sent nothing to the
-- bank for that step after it, so a settlement file's window ends there (the booking window
-- after it), not when an operator or a later file settled it, which may be days later. An
-- authorization settled as found, waiting for its capture again, clears a payment's: its capture
-- is a new step. Metadata only (nullable, no default); only the rare move into or out of unknown
-- writes it. Those unknown now get the time they became unknown: their updated_at. The moment's
-- lock gives up after 1 s rather than queue every payment behind a long reader (kasa migrate tries
-- again later).
-- +goose Up
SET LOCAL lock_timeout = '1s';
ALTER TABLE payments ADD COLUMN IF NOT EXISTS unknown_at timestamptz;
ALTER TABLE refunds ADD COLUMN IF NOT EXISTS unknown_at timestamptz;
UPDATE payments p SET unknown_at = p.updated_at FROM idempotency_records r
WHERE r.status = 'unknown' AND r.operation_id = p.id AND p.status = 'unknown' AND p.unknown_at IS NULL;
UPDATE payments p SET unknown_at = p.updated_at FROM open_authorizations a
WHERE a.payment_id = p.id AND p.status = 'unknown' AND p.unknown_at IS NULL;
UPDATE refunds SET unknown_at = updated_at WHERE status = 'unknown' AND unknown_at IS NULL;

-- +goose Down
ALTER TABLE refunds DROP COLUMN IF EXISTS unknown_at;
ALTER TABLE payments DROP COLUMN IF EXISTS unknown_at;
