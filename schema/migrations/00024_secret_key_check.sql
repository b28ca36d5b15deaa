-- Every process of a deployment must seal and open webhook secrets with one KASA_SECRET_KEY. The
-- first process to start records a check value derived from its key (never the key); every later
-- one compares its own and refuses to start on a difference (docs/deployment.md).
-- +goose Up
CREATE TABLE IF NOT EXISTS secret_key_check (
    id          int         PRIMARY KEY CHECK (id = 1),
    check_value bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE IF EXISTS secret_key_check;
