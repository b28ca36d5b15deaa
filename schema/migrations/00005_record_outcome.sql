-- +goose Up
-- A completed record keeps the operation's outcome (succeeded or failed) with its stored answer,
-- not a transport's status code: the API maps the outcome to its HTTP status.
ALTER TABLE idempotency_records ADD COLUMN outcome text CHECK (outcome IN ('succeeded', 'failed'));
UPDATE idempotency_records SET outcome = CASE response_status WHEN 201 THEN 'succeeded' WHEN 402 THEN 'failed' END
WHERE response_status IS NOT NULL;
ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_response;
ALTER TABLE idempotency_records DROP COLUMN response_status;
ALTER TABLE idempotency_records ADD CONSTRAINT idempotency_response CHECK ((response_body IS NULL) = (outcome IS NULL));

-- +goose Down
ALTER TABLE idempotency_records ADD COLUMN response_status int;
UPDATE idempotency_records SET response_status = CASE outcome WHEN 'succeeded' THEN 201 WHEN 'failed' THEN 402 END
WHERE outcome IS NOT NULL;
ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_response;
ALTER TABLE idempotency_records DROP COLUMN outcome;
ALTER TABLE idempotency_records ADD CONSTRAINT idempotency_response CHECK ((response_body IS NULL) = (response_status IS NULL));
