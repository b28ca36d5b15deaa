-- +goose Up
-- The workflow run that took the operation on (its first step): a payment is held only while it
-- is processing, and a step that the same run executes again after its worker died is told apart
-- from a second run of a payment already decided. Not indexed, so the first step's update stays HOT.
ALTER TABLE idempotency_records ADD COLUMN run_id text;

-- +goose Down
ALTER TABLE idempotency_records DROP COLUMN run_id;
