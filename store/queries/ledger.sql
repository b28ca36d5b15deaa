-- The double-entry ledger: postings and their entries.

-- name: InsertPosting :exec
INSERT INTO ledger_postings (id, kind, reference) VALUES ($1, $2, $3);

-- name: InsertEntryPair :exec
-- A two-entry posting in one statement, which must balance when it ends (the trigger
-- ledger_entries_balanced); the caller applies the balances.
INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
VALUES ($1, $2, $3, $4, $5), ($6, $2, $7, $4, $8);

-- name: EntriesFor :many
SELECT p.id, p.kind, e.account_id, e.currency, e.amount_minor
FROM ledger_postings p JOIN ledger_entries e ON e.posting_id = p.id
WHERE p.reference = $1 ORDER BY e.id;

-- name: PostPayment :exec
-- A payment's capture in one statement: the payer's hold and balance ($1, $2), the posting and its
-- two entries, and last the credit to one of the merchant's settlement shards ($8, $9), whose lock
-- other payments to the merchant may wait for: the commit follows at once. The credit reads the
-- capture's row, so it runs after it: the payer's account is locked before the shard, as a refund,
-- which locks the shards and then credits the payer, would otherwise deadlock with it.
WITH captured AS (
  UPDATE accounts SET reserved = reserved - $2::bigint, balance = balance - $2::bigint, updated_at = now()
  WHERE accounts.id = $1 RETURNING accounts.id
), posting AS (
  INSERT INTO ledger_postings (id, kind, reference) VALUES ($3, 'payment', $4)
), entries AS (
  INSERT INTO ledger_entries (id, posting_id, account_id, currency, amount_minor)
  VALUES ($5, $3, $1, $6, 0 - $2::bigint), ($7, $3, $8, $6, $2::bigint)
)
INSERT INTO settlement_shards (account_id, shard, balance) SELECT $8, $9, $2::bigint FROM captured
ON CONFLICT (account_id, shard) DO UPDATE SET balance = settlement_shards.balance + excluded.balance;
