-- +goose Up
-- Idempotency records of finished operations are deleted once their retention ends, and a request
-- with an expired key is a new request: for refunds as for payments, a key may then name several
-- refunds over time (at most one with a live record). RefundByKey reads the newest.
DROP INDEX refunds_key;
CREATE INDEX refunds_key ON refunds (merchant_id, idempotency_key, created_at);

-- +goose Down
-- Fails when an expired key was reused for a second refund: the layout cannot go back then.
DROP INDEX refunds_key;
CREATE UNIQUE INDEX refunds_key ON refunds (merchant_id, idempotency_key);
