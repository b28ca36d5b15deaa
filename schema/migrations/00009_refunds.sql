-- +goose Up
-- Refunds have idempotency keys of their own, a key space per merchant beside the payments':
-- the same key may name one payment and one refund. Existing records are payments'.
ALTER TABLE idempotency_records
    ADD COLUMN scope text NOT NULL DEFAULT 'payment' CHECK (scope IN ('payment', 'refund'));
-- Records of finished operations are deleted once their retention ends while their payments are
-- kept, so a payment can no longer reference its record.
ALTER TABLE payments DROP CONSTRAINT payments_merchant_id_idempotency_key_fkey;
ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_pkey,
    ADD CONSTRAINT idempotency_records_pkey PRIMARY KEY (merchant_id, scope, idempotency_key);

-- What of a payment is refunded (succeeded refunds) and held (refunds in flight or unknown):
-- concurrent refunds are held by a conditional update, and this CHECK makes sure that no
-- interleaving of them can give back more than was charged.
ALTER TABLE payments
    ADD COLUMN refunded_minor bigint NOT NULL DEFAULT 0,
    ADD COLUMN refund_held_minor bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT payments_refundable CHECK (refunded_minor >= 0 AND refund_held_minor >= 0
        AND refunded_minor + refund_held_minor <= amount_minor);

-- refunds.id is the refund's operation id (UUIDv7): the workflow's input, the provider's
-- idempotency key, the key of the hold on the merchant's settlement account and the reference of
-- its ledger posting. account_id is the payer's account, which the refund credits.
-- send_attempts counts the sends a worker began, as payments.charge_attempts does for charges.
CREATE TABLE refunds (
    id                  uuid        PRIMARY KEY,
    payment_id          uuid        NOT NULL REFERENCES payments (id),
    merchant_id         uuid        NOT NULL REFERENCES merchants (id),
    idempotency_key     text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    account_id          uuid        NOT NULL REFERENCES accounts (id),
    amount_minor        bigint      NOT NULL CHECK (amount_minor > 0),
    currency            char(3)     NOT NULL,
    reason              text        CHECK (char_length(reason) BETWEEN 1 AND 200),
    status              text        NOT NULL CHECK (status IN ('processing', 'succeeded', 'failed', 'unknown')),
    failure_code        text,
    provider_reference  text,
    send_attempts       integer     NOT NULL DEFAULT 0 CHECK (send_attempts >= 0),
    stuck_since         timestamptz,
    stuck_reason        text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT refunds_failure CHECK ((status = 'failed') = (failure_code IS NOT NULL))
);
CREATE UNIQUE INDEX refunds_key ON refunds (merchant_id, idempotency_key);
-- A payment's refunds, newest first (keyset pages), and what verify sums per payment.
CREATE INDEX refunds_payment ON refunds (payment_id, created_at, id);
CREATE INDEX refunds_unknown ON refunds (updated_at) WHERE status = 'unknown';
CREATE INDEX refunds_stuck ON refunds (stuck_since) WHERE stuck_since IS NOT NULL;
CREATE INDEX refunds_processing ON refunds (created_at) WHERE status = 'processing';

-- A refund is what was asked for, once: only its progress changes, and a final status stays.
-- +goose StatementBegin
CREATE FUNCTION refund_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        RAISE EXCEPTION 'refunds are kept: a refund cannot be deleted' USING ERRCODE = 'restrict_violation';
    END IF;
    IF (NEW.id, NEW.payment_id, NEW.merchant_id, NEW.idempotency_key, NEW.account_id, NEW.amount_minor,
        NEW.currency, NEW.reason, NEW.created_at)
       IS DISTINCT FROM (OLD.id, OLD.payment_id, OLD.merchant_id, OLD.idempotency_key, OLD.account_id,
        OLD.amount_minor, OLD.currency, OLD.reason, OLD.created_at) THEN
        RAISE EXCEPTION 'refund % is immutable: only its status and progress change', OLD.id
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF OLD.status IN ('succeeded', 'failed') AND NEW.status IS DISTINCT FROM OLD.status THEN
        RAISE EXCEPTION 'refund % is % and cannot become %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER refunds_immutable BEFORE UPDATE OR DELETE ON refunds
    FOR EACH ROW EXECUTE FUNCTION refund_immutable();
CREATE TRIGGER refunds_no_truncate BEFORE TRUNCATE ON refunds
    FOR EACH STATEMENT EXECUTE FUNCTION refund_immutable();

-- A refund's hold is on the merchant's settlement account, under the refund's id.
ALTER TABLE balance_reservations DROP CONSTRAINT balance_reservations_operation_id_fkey;

ALTER TABLE ledger_postings DROP CONSTRAINT ledger_postings_kind_check,
    ADD CONSTRAINT ledger_postings_kind_check CHECK (kind IN ('deposit', 'payment', 'reversal', 'refund'));

-- +goose Down
-- Refunds' postings are immutable, so a database that made one cannot go back.
ALTER TABLE ledger_postings DROP CONSTRAINT ledger_postings_kind_check,
    ADD CONSTRAINT ledger_postings_kind_check CHECK (kind IN ('deposit', 'payment', 'reversal'));
ALTER TABLE balance_reservations ADD CONSTRAINT balance_reservations_operation_id_fkey
    FOREIGN KEY (operation_id) REFERENCES payments (id) NOT VALID;
DROP TABLE refunds;
DROP FUNCTION refund_immutable;
ALTER TABLE payments DROP CONSTRAINT payments_refundable, DROP COLUMN refund_held_minor, DROP COLUMN refunded_minor;
DELETE FROM idempotency_records WHERE scope = 'refund';
ALTER TABLE idempotency_records DROP CONSTRAINT idempotency_records_pkey,
    ADD CONSTRAINT idempotency_records_pkey PRIMARY KEY (merchant_id, idempotency_key);
ALTER TABLE payments ADD CONSTRAINT payments_merchant_id_idempotency_key_fkey
    FOREIGN KEY (merchant_id, idempotency_key) REFERENCES idempotency_records (merchant_id, idempotency_key) NOT VALID;
ALTER TABLE idempotency_records DROP COLUMN scope;
