-- +goose NO TRANSACTION
-- A payment's commands by the payment: whether a capture is in flight, and when its capture or
-- cancel first arrived (where a capture's settlement window starts), for reconciliation. Built
-- concurrently: commands keep being written.
-- +goose Up
CREATE INDEX CONCURRENTLY IF NOT EXISTS payment_commands_payment ON payment_commands (payment_id, created_at);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS payment_commands_payment;
