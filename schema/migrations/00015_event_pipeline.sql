-- +goose NO TRANSACTION
-- The webhook sender's claim walks the due deliveries in (next_attempt_at, id) order and stops
-- after a bounded number of them, going on from the last one when it needs more: the index
-- gives that order itself, so a claim reads what it takes instead of sorting the whole backlog.
--
-- A claim sets the lease (claimed_until) and counts the attempt. Neither is indexed any more, so
-- PostgreSQL updates the row in place (HOT): no new entry in any of the table's indexes and a
-- WAL record of the changed bytes instead of the whole row. The in-flight count per merchant
-- reads the merchant's due rows, oldest first, instead of an index of the leased ones: a leased
-- row is due (it was when claimed) and among the oldest, so the count finds the limit's worth
-- first. The pages keep room for the new versions (fillfactor; rows written before keep their
-- pages as they are).
-- Indexes are built before the old ones are dropped, concurrently: deliveries keep being
-- written meanwhile.
-- +goose Up
-- A build that a canceled run left invalid is built again.
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_due_order;
CREATE INDEX CONCURRENTLY webhook_deliveries_due_order ON webhook_deliveries (next_attempt_at, id)
    WHERE status = 'pending';
-- A build that a canceled run left invalid is built again.
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_pending_merchant;
CREATE INDEX CONCURRENTLY webhook_deliveries_pending_merchant ON webhook_deliveries (merchant_id, next_attempt_at)
    WHERE status = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_due;
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_claimed;
ALTER TABLE webhook_deliveries SET (fillfactor = 50);

-- +goose Down
ALTER TABLE webhook_deliveries RESET (fillfactor);
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_deliveries_claimed ON webhook_deliveries (merchant_id)
    WHERE status = 'pending' AND claimed_until IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_pending_merchant;
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_due_order;
