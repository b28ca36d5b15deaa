-- +goose Up
-- How many times a worker has begun sending this payment's charge. The charge runs as a local
-- activity, which a new worker runs again when the previous one died before its workflow task
-- completed; the count, committed before each send, tells the repeat that an earlier attempt
-- may have reached the provider (never re-send without idempotency; inquire first with it).
ALTER TABLE payments ADD COLUMN charge_attempts integer NOT NULL DEFAULT 0 CHECK (charge_attempts >= 0);

-- +goose Down
ALTER TABLE payments DROP COLUMN charge_attempts;
