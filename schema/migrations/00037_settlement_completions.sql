-- The days a settlement import proved complete (a trailer), for the scope it covered: one row per
-- line type (kind) and merchant it covered (merchant_id NULL: every merchant), complete up to
-- as_of (the trailer's, never later than the import). Written by an import (not a dry run) before
-- it reads which days are complete: a later import counts such a day of a payment's or refund's
-- charge window as covered, so a window over midnight is settled by the second day's file. A few
-- rows a day, kept for good.
-- +goose Up
CREATE TABLE IF NOT EXISTS settlement_completions (
    kind        text        NOT NULL CHECK (kind IN ('charge', 'refund')),
    day         date        NOT NULL,
    merchant_id uuid,
    as_of       timestamptz NOT NULL,
    imported_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT settlement_completions_key UNIQUE NULLS NOT DISTINCT (kind, day, merchant_id, as_of)
);

-- +goose Down
DROP TABLE IF EXISTS settlement_completions;
