-- The deployment's secret key check (see the migration).

-- name: SecretKeyCheck :one
-- Records $1 unless a check value is there, and returns the one that is.
WITH ins AS (
  INSERT INTO secret_key_check (id, check_value) VALUES (1, $1) ON CONFLICT (id) DO NOTHING RETURNING check_value
)
SELECT check_value FROM ins UNION ALL SELECT check_value FROM secret_key_check WHERE id = 1 LIMIT 1;

-- name: GetSecretKeyCheck :one
-- The recorded check value, read after a concurrent first process recorded it (its insert won,
-- and the statement above could not see its row yet).
SELECT check_value FROM secret_key_check WHERE id = 1;

-- name: SealedWebhookSecrets :many
-- Every merchant's sealed webhook secrets, locked for a key rotation.
SELECT id, webhook_secret_enc, webhook_secret_prev_enc FROM merchants ORDER BY id FOR UPDATE;

-- name: ResealWebhookSecrets :exec
UPDATE merchants SET webhook_secret_enc = @webhook_secret_enc, webhook_secret_prev_enc = @webhook_secret_prev_enc
WHERE id = @id;

-- name: SetSecretKeyCheck :exec
-- A rotation's last step: the deployment's key is now this one.
INSERT INTO secret_key_check (id, check_value) VALUES (1, @check_value)
ON CONFLICT (id) DO UPDATE SET check_value = EXCLUDED.check_value, created_at = now();
