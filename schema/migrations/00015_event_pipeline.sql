-- +goose NO TRANSACTION
-- The webhook sender's claim walks the due deliveries in (next_attempt_at, id) order and stops
-- after a bounded number of them, going on from the last one when it needs more: the index
-- gives that order itself, so a claim reads what it takes instead of sorting the whole backlog.
-- Built before the old one is dropped, concurrently: deliveries keep being written meanwhile.
-- +goose Up
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_deliveries_due_order ON webhook_deliveries (next_attempt_at, id)
    WHERE status = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_due;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_due_order;
