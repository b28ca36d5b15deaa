-- When a refund last became unknown, kept once it is settled, as payments.unknown_at: kasa sent
-- nothing to the bank for it after that, so a settlement file's window for it ends there (the
-- booking window after it), not when an operator or a later file settled it. Metadata only
-- (nullable, no default), not indexed; refunds unknown now get their updated_at, when they
-- became unknown (refunds_unknown finds them).
-- +goose Up
ALTER TABLE refunds ADD COLUMN IF NOT EXISTS unknown_at timestamptz;
UPDATE refunds SET unknown_at = updated_at WHERE status = 'unknown' AND unknown_at IS NULL;

-- +goose Down
ALTER TABLE refunds DROP COLUMN IF EXISTS unknown_at;
