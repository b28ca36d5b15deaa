-- A record the backlog's drainer claimed (docs/operations.md, "Payday"): a drainer that takes the
-- lead counts the ones still processing among the payments it keeps started, as the last leader
-- did, rather than starting as many more. Set by the claim, which writes the record anyway; no
-- index names it, so the claim stays a HOT update. A constant default adds it without a rewrite;
-- the lock gives up after 1 s rather than queue every payment behind a long reader (kasa migrate
-- tries again later).
-- +goose Up
SET LOCAL lock_timeout = '1s';
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS drained boolean NOT NULL DEFAULT false;

-- +goose Down
SET LOCAL lock_timeout = '1s';
ALTER TABLE idempotency_records DROP COLUMN IF EXISTS drained;
