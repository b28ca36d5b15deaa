-- +goose NO TRANSACTION
-- Migrations 15, 17 and 27 built these indexes concurrently with IF NOT EXISTS: one that a
-- canceled run left invalid was taken as built on a later run, and then enforces and serves
-- nothing (payment_commands_taken keeps a payment to one taken command). Each is built again,
-- concurrently: writes go on meanwhile, and a sound one is only rebuilt.
-- +goose Up
REINDEX INDEX CONCURRENTLY payment_commands_taken;
REINDEX INDEX CONCURRENTLY webhook_deliveries_due_order;
REINDEX INDEX CONCURRENTLY webhook_deliveries_pending_merchant;
REINDEX INDEX CONCURRENTLY outbox_published_order;

-- +goose Down
SELECT 1;
