-- Every admin call, append-only (docs/security.md): which admin token made it (by its id, never
-- the token), what it asked for, when, and how it was answered. The application role may insert
-- and read it, never change or delete a row.
-- +goose Up
CREATE TABLE IF NOT EXISTS admin_audit (
    id         uuid        PRIMARY KEY, -- UUIDv7: the list's keyset order is the calls' order
    at         timestamptz NOT NULL DEFAULT now(),
    token_id   text        NOT NULL,
    method     text        NOT NULL,
    route      text        NOT NULL, -- the route's pattern, /admin/v1/accounts/:id/deposits
    target     text        NOT NULL, -- the request's path and query, /admin/v1/accounts/<id>/deposits
    status     int         NOT NULL, -- the HTTP status it was answered with
    request_id text        NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS admin_audit;
