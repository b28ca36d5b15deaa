-- The days a settlement file listed each payment (charge) and refund on, one row per day,
-- written by an import (not a dry run) before it acts on the line: a later file listing one on
-- another day is the bank saying it moved the money twice, across days. Grows as payments do,
-- which are kept for good too.
-- +goose Up
CREATE TABLE IF NOT EXISTS settlement_listings (
    kind        text        NOT NULL CHECK (kind IN ('charge', 'refund')),
    reference   uuid        NOT NULL,
    day         date        NOT NULL,
    imported_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, reference, day)
);

-- +goose Down
DROP TABLE IF EXISTS settlement_listings;
