-- Account and merchant creations under an operator's Idempotency-Key (see the migration).

-- name: InsertAccountCreation :execrows
-- Waits for a concurrent creation with the same key to end; 0 rows: the key is taken.
INSERT INTO account_creations (merchant_id, idempotency_key, account_id) VALUES ($1, $2, $3)
ON CONFLICT (merchant_id, idempotency_key) DO NOTHING;

-- name: AccountCreation :one
SELECT account_id FROM account_creations WHERE merchant_id = $1 AND idempotency_key = $2;

-- name: InsertMerchantCreation :execrows
-- Waits for a concurrent creation with the same key to end; 0 rows: the key is taken.
INSERT INTO merchant_creations (idempotency_key, merchant_id, api_key_id, request_hash, answer_enc)
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (idempotency_key) DO NOTHING;

-- name: MerchantCreation :one
SELECT merchant_id, api_key_id, request_hash, answer_enc FROM merchant_creations WHERE idempotency_key = $1;

-- name: ForgetCreationAnswers :execrows
-- Retention: a merchant creation's sealed secrets go once the idempotency retention has passed;
-- the key keeps naming its merchant.
UPDATE merchant_creations SET answer_enc = NULL
WHERE answer_enc IS NOT NULL AND created_at < now() - sqlc.arg(retention_seconds)::float8 * interval '1 second';

-- name: SealedCreationAnswers :many
-- Owner only: the merchant creations' sealed answers, for a key rotation.
SELECT idempotency_key, answer_enc FROM merchant_creations WHERE answer_enc IS NOT NULL ORDER BY idempotency_key
FOR UPDATE;

-- name: ResealCreationAnswer :exec
-- Owner only.
UPDATE merchant_creations SET answer_enc = @answer_enc WHERE idempotency_key = @idempotency_key;
