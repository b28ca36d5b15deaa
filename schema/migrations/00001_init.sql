-- +goose Up
-- Merchants authenticate with an API key; only its SHA-256 is stored. The webhook secret must be
-- usable to sign, so it is stored encrypted (AES-GCM with the server's secret key), never in clear.
CREATE TABLE merchants (
    id                   uuid        PRIMARY KEY,
    name                 text        NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    api_key_hash         bytea       NOT NULL UNIQUE,
    webhook_url          text,
    webhook_secret_enc   bytea       NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now()
);

-- kind: 'customer' (a payer's account, owned by a merchant), 'settlement' (the merchant's own
-- account, credited by payments; one per currency) and 'external' (the outside world's side of
-- deposits; one per currency, its balance goes negative as money enters the system).
CREATE TABLE accounts (
    id           uuid        PRIMARY KEY,
    merchant_id  uuid        REFERENCES merchants (id),
    kind         text        NOT NULL CHECK (kind IN ('customer', 'settlement', 'external')),
    currency     char(3)     NOT NULL,
    balance      bigint      NOT NULL DEFAULT 0,
    reserved     bigint      NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT accounts_funds CHECK (reserved >= 0 AND (kind = 'external' OR balance - reserved >= 0)),
    CONSTRAINT accounts_owner CHECK ((kind = 'external') = (merchant_id IS NULL))
);
CREATE UNIQUE INDEX accounts_one_settlement ON accounts (merchant_id, currency) WHERE kind = 'settlement';
CREATE UNIQUE INDEX accounts_one_external ON accounts (currency) WHERE kind = 'external';
CREATE INDEX accounts_merchant ON accounts (merchant_id);

-- The idempotency record is a state machine: processing -> completed | unknown (-> completed).
-- It is committed in its own short transaction before Temporal or the provider is called.
-- locked_until is the lease of whoever must start the workflow; once started, the workflow owns it.
CREATE TABLE idempotency_records (
    merchant_id      uuid        NOT NULL REFERENCES merchants (id),
    idempotency_key  text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    request_hash     char(64)    NOT NULL,
    status           text        NOT NULL CHECK (status IN ('processing', 'completed', 'unknown')),
    operation_id     uuid        NOT NULL UNIQUE,
    response_status  int,
    response_body    bytea,
    locked_until     timestamptz,
    workflow_started boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, idempotency_key),
    CONSTRAINT idempotency_response CHECK ((response_body IS NULL) = (response_status IS NULL))
);
-- The sweeper looks for records whose owner died before starting the workflow.
CREATE INDEX idempotency_unstarted ON idempotency_records (locked_until) WHERE NOT workflow_started;

-- payments.id is the operation id (UUIDv7): the workflow's input, the provider's idempotency key,
-- the reservation's key and the ledger posting's reference.
CREATE TABLE payments (
    id                  uuid        PRIMARY KEY,
    merchant_id         uuid        NOT NULL REFERENCES merchants (id),
    idempotency_key     text        NOT NULL,
    account_id          uuid        NOT NULL REFERENCES accounts (id),
    amount_minor        bigint      NOT NULL CHECK (amount_minor > 0),
    currency            char(3)     NOT NULL,
    invoice_id          text        NOT NULL,
    payment_type        text        NOT NULL,
    status              text        NOT NULL CHECK (status IN ('processing', 'succeeded', 'failed', 'unknown')),
    failure_code        text,
    provider_reference  text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (merchant_id, idempotency_key) REFERENCES idempotency_records (merchant_id, idempotency_key),
    CONSTRAINT payments_failure CHECK ((status = 'failed') = (failure_code IS NOT NULL))
);
-- The business key: one live (processing, unknown or succeeded) payment per invoice and type.
-- A failed payment does not block a new attempt under a new idempotency key.
CREATE UNIQUE INDEX payments_business_key ON payments (merchant_id, invoice_id, payment_type)
    WHERE status IN ('processing', 'unknown', 'succeeded');
CREATE INDEX payments_unknown ON payments (updated_at) WHERE status = 'unknown';

-- At most one reservation per operation: a retried ReserveFunds can never reserve twice.
-- An unknown payment keeps its reservation until reconciled.
CREATE TABLE balance_reservations (
    id            uuid        PRIMARY KEY,
    operation_id  uuid        NOT NULL UNIQUE REFERENCES payments (id),
    account_id    uuid        NOT NULL REFERENCES accounts (id),
    amount_minor  bigint      NOT NULL CHECK (amount_minor > 0),
    status        text        NOT NULL CHECK (status IN ('active', 'finalized', 'released')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX balance_reservations_active ON balance_reservations (account_id) WHERE status = 'active';

-- The ledger is the source of truth; accounts.balance is its running summary. A posting groups
-- entries that sum to zero per currency; (kind, reference) makes every posting idempotent.
CREATE TABLE ledger_postings (
    id          uuid        PRIMARY KEY,
    kind        text        NOT NULL CHECK (kind IN ('deposit', 'payment', 'reversal')),
    reference   text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (kind, reference)
);

CREATE TABLE ledger_entries (
    id            uuid        PRIMARY KEY,
    posting_id    uuid        NOT NULL REFERENCES ledger_postings (id),
    account_id    uuid        NOT NULL REFERENCES accounts (id),
    currency      char(3)     NOT NULL,
    amount_minor  bigint      NOT NULL CHECK (amount_minor <> 0),
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_entries_posting ON ledger_entries (posting_id);
CREATE INDEX ledger_entries_account ON ledger_entries (account_id);

-- Admin deposits are idempotent per (account, Idempotency-Key).
CREATE TABLE deposits (
    id               uuid        PRIMARY KEY,
    account_id       uuid        NOT NULL REFERENCES accounts (id),
    idempotency_key  text        NOT NULL,
    amount_minor     bigint      NOT NULL CHECK (amount_minor > 0),
    posting_id       uuid        NOT NULL REFERENCES ledger_postings (id),
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, idempotency_key)
);

-- Transactional outbox: every payment state change inserts its event in the same transaction.
CREATE TABLE outbox (
    id            uuid        PRIMARY KEY,
    aggregate_id  uuid        NOT NULL,
    type          text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (created_at) WHERE published_at IS NULL;

-- Consumers record processed message ids in the same transaction as their effect.
CREATE TABLE inbox (
    consumer      text        NOT NULL,
    message_id    uuid        NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- +goose StatementBegin
CREATE FUNCTION ledger_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger rows are immutable: correct with a reversal posting'
        USING ERRCODE = 'restrict_violation';
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER ledger_postings_immutable BEFORE UPDATE OR DELETE ON ledger_postings
    FOR EACH ROW EXECUTE FUNCTION ledger_immutable();
CREATE TRIGGER ledger_entries_immutable BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_immutable();
CREATE TRIGGER ledger_postings_no_truncate BEFORE TRUNCATE ON ledger_postings
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_immutable();
CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_immutable();

-- A posting must balance per currency when its transaction commits (checked once per posting).
-- +goose StatementBegin
CREATE FUNCTION ledger_posting_balanced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger_entries WHERE posting_id = NEW.posting_id
               GROUP BY currency HAVING sum(amount_minor) <> 0) THEN
        RAISE EXCEPTION 'ledger posting % does not balance', NEW.posting_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ledger_balanced';
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE CONSTRAINT TRIGGER ledger_entries_balanced AFTER INSERT ON ledger_entries
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ledger_posting_balanced();

-- +goose Down
DROP TABLE inbox, outbox, deposits, ledger_entries, ledger_postings, balance_reservations,
    payments, idempotency_records, accounts, merchants;
DROP FUNCTION ledger_posting_balanced, ledger_immutable;
