-- Merchants' API keys and webhook secret rotation.

-- name: InsertAPIKey :execrows
-- No row when there is no such merchant.
INSERT INTO api_keys (id, merchant_id, key_hash)
SELECT sqlc.arg(id)::uuid, m.id, sqlc.arg(key_hash)::bytea FROM merchants m WHERE m.id = sqlc.arg(merchant_id)::uuid;

-- name: RevokeAPIKey :execrows
-- A key revoked before keeps its first revocation time. No row: not this merchant's key.
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 AND merchant_id = $2;

-- name: APIKeysOf :many
SELECT id, created_at, revoked_at FROM api_keys WHERE merchant_id = $1 ORDER BY id;

-- name: RotateWebhookSecret :one
-- The current secret becomes the previous one for overlap_seconds (an older previous one is
-- dropped); with no overlap (a leaked secret revoked at once) no previous one is kept at all.
-- It answers when the previous one stops signing: now, by the database's clock, when revoked.
UPDATE merchants
SET webhook_secret_prev_enc = CASE WHEN sqlc.arg(overlap_seconds)::float8 > 0 THEN webhook_secret_enc END,
    webhook_secret_prev_until = CASE WHEN sqlc.arg(overlap_seconds)::float8 > 0
        THEN now() + sqlc.arg(overlap_seconds)::float8 * interval '1 second' END,
    webhook_secret_enc = sqlc.arg(webhook_secret_enc)
WHERE id = sqlc.arg(id)
RETURNING coalesce(webhook_secret_prev_until, now())::timestamptz AS previous_until;
