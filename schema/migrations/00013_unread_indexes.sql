-- +goose NO TRANSACTION
-- Two indexes that every payment writes and no query reads. balance_reservations_active named
-- the reservation's status, so closing a reservation could never be updated in place (HOT): it
-- wrote a new entry into each of the table's indexes. kasa verify, its only reader, sums the
-- active reservations in a scan as it sums the ledger. ledger_entries_account served no query:
-- entries are read by posting. Dropped concurrently: payments keep being written meanwhile.
-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS balance_reservations_active;
DROP INDEX CONCURRENTLY IF EXISTS ledger_entries_account;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS balance_reservations_active ON balance_reservations (account_id) WHERE status = 'active';
CREATE INDEX CONCURRENTLY IF NOT EXISTS ledger_entries_account ON ledger_entries (account_id);
