-- +goose Up
-- A payment whose workflow cannot go on (the data contradicts a step) is flagged here until an
-- operator resolves it: the stuck-payments metric and runbook (docs/operations.md) read it.
ALTER TABLE payments ADD COLUMN stuck_since timestamptz, ADD COLUMN stuck_reason text;
CREATE INDEX payments_stuck ON payments (stuck_since) WHERE stuck_since IS NOT NULL;
-- Processing payments old enough to be stuck without a flag (their workflow is gone) are
-- counted by age: this keeps the count cheap however many finished payments there are.
CREATE INDEX payments_processing ON payments (created_at) WHERE status = 'processing';

-- +goose Down
DROP INDEX payments_processing;
DROP INDEX payments_stuck;
ALTER TABLE payments DROP COLUMN stuck_reason, DROP COLUMN stuck_since;
