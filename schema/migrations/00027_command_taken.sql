-- +goose NO TRANSACTION
-- The capture or cancel a manual payment's workflow took is marked in the transaction that moves
-- its money: a key whose request never reached the workflow learns, when retried, that another
-- command decided the payment, and is refused instead of answered with that one's effect.
-- At most one command of a payment is taken; the index finds it without reading the others, and
-- is built concurrently: commands keep being written (the table keeps every key for good).
-- +goose Up
ALTER TABLE payment_commands ADD COLUMN IF NOT EXISTS taken boolean NOT NULL DEFAULT false;
-- A build that a canceled run left invalid is built again.
DROP INDEX CONCURRENTLY IF EXISTS payment_commands_taken;
CREATE UNIQUE INDEX CONCURRENTLY payment_commands_taken ON payment_commands (payment_id) WHERE taken;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS payment_commands_taken;
ALTER TABLE payment_commands DROP COLUMN IF EXISTS taken;
