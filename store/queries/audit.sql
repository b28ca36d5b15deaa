-- The admin audit: one row per admin call, never changed.

-- name: InsertAudit :exec
INSERT INTO admin_audit (id, token_id, method, route, target, status, request_id) VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: ListAudit :many
-- Newest first, the page after (older than) $1 (the newest id possible for the first page).
SELECT * FROM admin_audit WHERE id < $1 ORDER BY id DESC LIMIT $2;
