-- A rotation of KASA_SECRET_KEY (kasa rotate-secret-key) retires the key it replaces: its check
-- value is kept here, and a process started with a retired key is refused, even with the new
-- key as its previous one (docs/deployment.md, "Rotating KASA_SECRET_KEY").
-- +goose Up
ALTER TABLE secret_key_check ADD COLUMN IF NOT EXISTS retired bytea[] NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE secret_key_check DROP COLUMN IF EXISTS retired;
