-- +goose NO TRANSACTION
-- Retention deletes finished webhook deliveries (delivered, failed, skipped) last changed before
-- its cutoff. Without an index for that, each pass read the whole table, inline in the relay's
-- loop, even with nothing to delete (0.8 s for 2 M recent rows). The index holds the finished
-- rows by their creation time, which a row changed before the cutoff was created before too: the
-- pass reads the finished rows created before the cutoff and no others. Not by updated_at: a
-- claim sets it, and an indexed column would make every claim a non-HOT update (migration 15);
-- neither created_at nor status changes when a delivery is claimed. Built concurrently:
-- deliveries keep being written meanwhile.
-- +goose Up
-- A build that a canceled run left invalid is built again.
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_finished;
CREATE INDEX CONCURRENTLY webhook_deliveries_finished ON webhook_deliveries (created_at)
    WHERE status IN ('delivered', 'failed', 'skipped');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS webhook_deliveries_finished;
