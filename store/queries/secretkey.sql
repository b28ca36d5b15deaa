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
