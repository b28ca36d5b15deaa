-- The database's clock: what stamps every row's time, and what leases, retention and windows
-- are judged by.

-- name: Now :one
SELECT now()::timestamptz AS now;
