-- A redelivery opens a new retry window: retry_base is the delivery's attempt count when it did
-- (0: none). The claim's backoff step is attempts - retry_base, and a result is fenced by attempt
-- numbers alone: retry_base >= an attempt's number means an operator redelivered since its claim.
-- Metadata only (a constant default), and not indexed: claims stay HOT updates. The moment's
-- lock gives up after 1 s rather than queue every sender behind a long reader (kasa migrate tries
-- again later).
-- +goose Up
SET LOCAL lock_timeout = '1s';
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS retry_base int NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE webhook_deliveries DROP COLUMN IF EXISTS retry_base;
