-- A transaction's id and fate: what a commit whose answer was lost on the way back did.

-- name: CurrentXact :one
-- The running transaction's id (assigned now if it had none).
SELECT pg_current_xact_id()::text AS xact;

-- name: XactStatus :one
-- committed, aborted or in progress; empty when the id is too old to be known.
SELECT coalesce(pg_xact_status(sqlc.arg(xact)::text::xid8)::text, '')::text AS status;
