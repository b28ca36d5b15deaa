-- What the application role may do: the whole list. kasa api, worker, relay, verify and reconcile
-- connect as this role (KASA_DATABASE_URL); `kasa migrate` connects as the tables' owner
-- (KASA_DATABASE_MIGRATE_URL) and, when KASA_DATABASE_APP_ROLE is set, applies this file after the
-- migrations, in one transaction with a check that every table got a grant. It starts by taking
-- everything away, so a privilege removed below is gone after the next `kasa migrate`.
-- docs/operations.md ("Database roles") has the commands.
--
-- The same file runs by hand: psql -v app_role=kasa_app -v schema=public -f schema/grants.sql
--
-- No TRUNCATE, REFERENCES or TRIGGER anywhere, and the role owns nothing, so it can neither
-- alter nor drop a table or a trigger. Keys are UUIDs: there is no sequence to grant.

REVOKE ALL ON ALL TABLES IN SCHEMA :"schema" FROM :"app_role";
REVOKE ALL ON ALL SEQUENCES IN SCHEMA :"schema" FROM :"app_role";
REVOKE CREATE ON SCHEMA :"schema" FROM :"app_role";
GRANT USAGE ON SCHEMA :"schema" TO :"app_role";

-- The ledger is append-only: corrections are new postings, never edits.
GRANT SELECT, INSERT ON ledger_postings, ledger_entries TO :"app_role";
-- Deposits are written once, with their posting.
GRANT SELECT, INSERT ON deposits TO :"app_role";

-- Merchants are created by the admin API and read by every process; rotating the webhook secret
-- updates the merchant's secret columns.
GRANT SELECT, INSERT, UPDATE ON merchants TO :"app_role";
-- An operator's creation key names its account or merchant for good; retention wipes a merchant
-- creation's sealed answer (UPDATE), and a key rotation re-seals it.
GRANT SELECT, INSERT ON account_creations TO :"app_role";
GRANT SELECT, INSERT, UPDATE ON merchant_creations TO :"app_role";
-- API keys are added and revoked (revoked_at is set once), never deleted.
GRANT SELECT, INSERT, UPDATE ON api_keys TO :"app_role";
-- Balances, reservations and payments change state as payments go through their steps.
GRANT SELECT, INSERT, UPDATE ON accounts, balance_reservations, payments TO :"app_role";
-- Idempotency records change state with their operations; the worker deletes those of finished
-- operations once their retention ends.
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_records TO :"app_role";
-- A settlement account's balance is in its shards: a payment's credit makes its shard when it
-- is the first, then updates it; shards are never deleted.
GRANT SELECT, INSERT, UPDATE ON settlement_shards TO :"app_role";
-- Refunds change state as they go through their steps; they are never deleted (a trigger
-- refuses it, and changes to what was asked for).
GRANT SELECT, INSERT, UPDATE ON refunds TO :"app_role";
-- A settlement file's listings are written once by an import, never changed or deleted.
GRANT SELECT, INSERT ON settlement_listings TO :"app_role";
-- The days an import proved complete, and for whom, are written once, never changed or deleted.
GRANT SELECT, INSERT ON settlement_completions TO :"app_role";
-- A capture's or cancel's key names it for good once answered; a refused one is deleted, as it
-- changed nothing.
GRANT SELECT, INSERT, UPDATE, DELETE ON payment_commands TO :"app_role";
-- The secret key's check value is written once, by the first process, and read by every other.
GRANT SELECT, INSERT ON secret_key_check TO :"app_role";
-- The admin audit is append-only.
GRANT SELECT, INSERT ON admin_audit TO :"app_role";
-- An authorization is open from its Authorized step to its capture or cancel.
GRANT SELECT, INSERT, DELETE ON open_authorizations TO :"app_role";

-- Events: the relay marks outbox rows published; retention deletes published outbox rows, inbox
-- rows and finished deliveries (their attempts go with them by ON DELETE CASCADE, which runs with
-- the owner's rights).
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox, webhook_deliveries TO :"app_role";
GRANT SELECT, INSERT, DELETE ON inbox TO :"app_role";
GRANT SELECT, INSERT ON webhook_attempts TO :"app_role";
-- The relay moves each consumer's confirmed point (outbox_confirmed) as the inbox fills.
GRANT SELECT, INSERT, UPDATE ON outbox_confirmed TO :"app_role";

-- One row per finished settlement file.
GRANT SELECT, INSERT ON reconciliation_runs TO :"app_role";

-- The processes read the migrations' version to wait for `kasa migrate`; only it writes.
GRANT SELECT ON goose_db_version TO :"app_role";

-- Workers report their charge policy at start and while they run; rows are never deleted.
GRANT SELECT, INSERT, UPDATE ON worker_policies TO :"app_role";

-- Record deleters announce their retention while they run; the APIs read it. Never deleted.
GRANT SELECT, INSERT, UPDATE ON record_retentions TO :"app_role";

-- The backlog's drainer keeps its one row current; the API reads it.
GRANT SELECT, INSERT, UPDATE ON backlog_state TO :"app_role";
