-- +goose Up
-- The idempotency retentions the processes that delete records run with, each with when it was
-- last announced: an API answers from its replay cache only records younger than the shortest a
-- live deleter uses (docs/deployment.md, "Money settings"). A few rows at most.
CREATE TABLE IF NOT EXISTS record_retentions (
    retention_ms bigint      PRIMARY KEY,
    last_seen    timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE record_retentions;
