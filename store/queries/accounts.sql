-- Merchants, accounts and deposits.

-- name: InsertMerchant :exec
INSERT INTO merchants (id, name, webhook_url, webhook_secret_enc)
VALUES ($1, $2, NULLIF($3, ''), $4);

-- name: MerchantByAPIKey :one
SELECT m.id, m.name, coalesce(m.webhook_url, '')
FROM api_keys k JOIN merchants m ON m.id = k.merchant_id
WHERE k.key_hash = $1 AND k.revoked_at IS NULL;

-- name: InsertAccount :exec
INSERT INTO accounts (id, merchant_id, kind, currency) VALUES ($1, $2, $3, $4);

-- name: EnsureSettlementAccount :exec
-- Every merchant gets one settlement account per currency it takes payments in.
INSERT INTO accounts (id, merchant_id, kind, currency) VALUES ($1, $2, 'settlement', $3)
ON CONFLICT (merchant_id, currency) WHERE kind = 'settlement' DO NOTHING;

-- name: GetAccount :one
SELECT id, coalesce(merchant_id, '00000000-0000-0000-0000-000000000000'), kind, currency, balance, reserved FROM accounts WHERE id = $1;

-- name: EnsureExternalAccount :exec
INSERT INTO accounts (id, kind, currency) VALUES ($1, 'external', $2) ON CONFLICT (currency) WHERE kind = 'external' DO NOTHING;

-- name: ExternalAccount :one
SELECT id FROM accounts WHERE kind = 'external' AND currency = $1;

-- name: InsertDeposit :one
INSERT INTO deposits (id, account_id, idempotency_key, amount_minor, posting_id)
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (account_id, idempotency_key) DO NOTHING RETURNING created_at;

-- name: GetDeposit :one
SELECT id, amount_minor, created_at FROM deposits WHERE account_id = $1 AND idempotency_key = $2;

-- name: Credit :exec
UPDATE accounts SET balance = balance + $2, updated_at = now() WHERE id = $1;
