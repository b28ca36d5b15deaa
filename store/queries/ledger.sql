-- The double-entry ledger: postings and their entries.

-- name: InsertPosting :exec
INSERT INTO ledger_postings (id, kind, reference) VALUES ($1, $2, $3);

-- name: InsertEntry :exec
INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor) VALUES ($1, $2, $3, $4, $5);

-- name: InsertEntryPair :exec
-- A two-entry posting in one statement; the caller applies the balances.
INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
VALUES ($1, $2, $3, $4, $5), ($6, $2, $7, $4, $8);

-- name: EntriesFor :many
SELECT p.id, p.kind, e.account_id, e.currency, e.amount_minor
FROM ledger_postings p JOIN ledger_entries e ON e.posting_id = p.id
WHERE p.reference = $1 ORDER BY e.id;
