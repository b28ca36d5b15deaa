-- +goose NO TRANSACTION
-- A currency holds at most what a bigint does: its external account's balance (minus all the
-- money deposited in it) stops one short of the smallest bigint. At the smallest, the currency
-- would hold one more than any balance, settlement shard or sum of shards can, and a payment
-- posting it to one merchant would fail after the bank charged it. Added NOT VALID, in a moment's
-- lock that gives up after 1 s rather than queue every payment behind a long reader (kasa
-- migrate tries again later), and validated apart, which lets writes go on.
-- +goose Up
-- +goose StatementBegin
DO $$
BEGIN
    SET LOCAL lock_timeout = '1s';
    ALTER TABLE accounts DROP CONSTRAINT IF EXISTS accounts_currency_bound;
    ALTER TABLE accounts ADD CONSTRAINT accounts_currency_bound CHECK (kind <> 'external' OR balance > -9223372036854775808) NOT VALID;
END $$;
-- +goose StatementEnd
ALTER TABLE accounts VALIDATE CONSTRAINT accounts_currency_bound;

-- +goose Down
ALTER TABLE accounts DROP CONSTRAINT IF EXISTS accounts_currency_bound;
