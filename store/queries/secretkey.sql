-- The deployment's secret key check (see the migration).

-- name: SecretKeyCheck :one
-- Records $1 unless a check value is there, and returns the deployment's key and the keys
-- rotations retired.
WITH ins AS (
  INSERT INTO secret_key_check (id, check_value) VALUES (1, $1) ON CONFLICT (id) DO NOTHING RETURNING check_value, retired
)
SELECT check_value, retired FROM ins UNION ALL SELECT check_value, retired FROM secret_key_check WHERE id = 1 LIMIT 1;

-- name: SecretKeyState :one
-- The deployment's key and the keys rotations retired; also read after a concurrent first
-- process recorded its key (its insert won, and SecretKeyCheck could not see its row yet).
SELECT check_value, retired FROM secret_key_check WHERE id = 1;

-- name: LockSecretKeyForRotation :one
-- Owner only (kasa rotate-secret-key), as the other rotation queries below.
SELECT check_value, retired FROM secret_key_check WHERE id = 1 FOR UPDATE;

-- name: LockMerchantsForRotation :exec
-- Owner only. No merchant row is written while a rotation re-seals them (a seal under a key it would not see
-- could be lost); reads, and the foreign-key checks of payments, go on.
LOCK TABLE merchants IN SHARE ROW EXCLUSIVE MODE;

-- name: SealedWebhookSecrets :many
-- Every merchant's sealed webhook secrets, for a key rotation.
SELECT id, webhook_secret_enc, webhook_secret_prev_enc FROM merchants ORDER BY id;

-- name: ResealWebhookSecrets :exec
-- Owner only.
UPDATE merchants SET webhook_secret_enc = @webhook_secret_enc, webhook_secret_prev_enc = @webhook_secret_prev_enc
WHERE id = @id;

-- name: RetireSecretKey :exec
-- Owner only. A rotation's last step: the deployment's key is now this one, and the one before is retired.
UPDATE secret_key_check SET check_value = @check_value, retired = array_append(retired, check_value), created_at = now()
WHERE id = 1;
