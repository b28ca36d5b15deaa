-- +goose Up
-- A merchant's settlement account is credited by every payment to the merchant: held in one row,
-- its row lock would cap the merchant at what one row can take. Its balance and reserved amount
-- live instead in sub-rows (shards), the account's being their sums: a payment credits one shard
-- chosen by its id, so concurrent payments to one merchant rarely wait for each other. Ledger
-- entries stay on the account. Each shard keeps balance - reserved >= 0, so the sums do too; a
-- hold or a debit (refunds) locks the account's shards in shard order and may span several.
CREATE TABLE settlement_shards (
    account_id  uuid     NOT NULL REFERENCES accounts (id),
    shard       smallint NOT NULL CHECK (shard >= 0),
    balance     bigint   NOT NULL DEFAULT 0,
    reserved    bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, shard),
    CONSTRAINT settlement_shards_funds CHECK (reserved >= 0 AND balance - reserved >= 0)
);

-- What the settlement accounts hold today moves into their first shard; their own row keeps
-- nothing from now on, so a write that still went to it would fail instead of being lost.
INSERT INTO settlement_shards (account_id, shard, balance, reserved)
SELECT id, 0, balance, reserved FROM accounts WHERE kind = 'settlement';
UPDATE accounts SET balance = 0, reserved = 0 WHERE kind = 'settlement' AND (balance <> 0 OR reserved <> 0);
ALTER TABLE accounts ADD CONSTRAINT accounts_settlement_in_shards
    CHECK (kind <> 'settlement' OR (balance = 0 AND reserved = 0));

-- +goose Down
ALTER TABLE accounts DROP CONSTRAINT accounts_settlement_in_shards;
UPDATE accounts a SET balance = s.balance, reserved = s.reserved
FROM (SELECT account_id, sum(balance) AS balance, sum(reserved) AS reserved FROM settlement_shards GROUP BY account_id) s
WHERE a.id = s.account_id;
DROP TABLE settlement_shards;
