-- +goose NO TRANSACTION
-- A currency holds at most what a bigint does: its external account's balance (minus all the
-- money deposited in it) stops one short of the smallest bigint. At the smallest, the currency
-- would hold one more than any balance, settlement shard or sum of shards can, and a payment
-- posting it to one merchant would fail after the bank charged it. Added NOT VALID (a moment's
-- lock) and validated apart, which lets writes go on.
-- +goose Up
ALTER TABLE accounts DROP CONSTRAINT IF EXISTS accounts_currency_bound;
ALTER TABLE accounts ADD CONSTRAINT accounts_currency_bound CHECK (kind <> 'external' OR balance > -9223372036854775808) NOT VALID;
ALTER TABLE accounts VALIDATE CONSTRAINT accounts_currency_bound;

-- +goose Down
ALTER TABLE accounts DROP CONSTRAINT IF EXISTS accounts_currency_bound;
