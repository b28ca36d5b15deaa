-- +goose Up
-- A refund key names its refund for good, after its idempotency record has expired too
-- (docs/api.md): BeginRefund refuses a key some refund already carries. The unique index says
-- the same in the database, where no expired key was reused before this rule (a deployment that
-- made such second refunds keeps the plain index, and the check in BeginRefund alone).
-- +goose StatementBegin
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM refunds GROUP BY merchant_id, idempotency_key HAVING count(*) > 1) THEN
    DROP INDEX refunds_key;
    CREATE UNIQUE INDEX refunds_key ON refunds (merchant_id, idempotency_key);
  END IF;
END $$;
-- +goose StatementEnd

-- +goose Down
DROP INDEX refunds_key;
CREATE INDEX refunds_key ON refunds (merchant_id, idempotency_key, created_at);
