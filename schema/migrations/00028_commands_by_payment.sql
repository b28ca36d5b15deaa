-- +goose NO TRANSACTION
-- A payment's commands by the payment: whether a capture is in flight, and when its capture or
-- cancel first arrived (where a capture's settlement window starts), for reconciliation. Built
-- concurrently: commands keep being written; a build that failed leaves an invalid index, which
-- a rerun drops and builds again.
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS payment_commands_payment;
CREATE INDEX CONCURRENTLY payment_commands_payment ON payment_commands (payment_id, created_at);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS payment_commands_payment;
