-- Authorize now, capture later (docs/api.md). A manual payment is authorized at the bank and
-- waits in requires_capture, its whole amount held on the payer, until it is captured (in part:
-- captured_minor) or canceled, or its capture_before passes. Refunds give back at most what was
-- captured. A canceled payment carries a failure code (canceled, or authorization_expired) like a
-- failed one: the business key's index (failure_code IS NULL) then lets its invoice be paid again.
-- payment_commands are the captures and cancels, each under a merchant's Idempotency-Key: one key
-- space for both, kept for good, so a key names its command once and for all.
-- +goose Up
ALTER TABLE payments
    ADD COLUMN IF NOT EXISTS capture_manual boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS capture_before timestamptz,
    ADD COLUMN IF NOT EXISTS captured_minor bigint NOT NULL DEFAULT 0;
ALTER TABLE payments DROP CONSTRAINT IF EXISTS payments_status_check,
    ADD CONSTRAINT payments_status_check CHECK (status IN
        ('processing', 'succeeded', 'failed', 'unknown', 'requires_capture', 'canceled'));
ALTER TABLE payments DROP CONSTRAINT IF EXISTS payments_failure,
    ADD CONSTRAINT payments_failure CHECK ((status IN ('failed', 'canceled')) = (failure_code IS NOT NULL));
ALTER TABLE payments DROP CONSTRAINT IF EXISTS payments_capture,
    ADD CONSTRAINT payments_capture CHECK (capture_manual = (capture_before IS NOT NULL)
        AND captured_minor >= 0 AND captured_minor <= amount_minor
        AND (capture_manual OR captured_minor = 0)
        AND (status IN ('requires_capture', 'canceled') <= capture_manual));
ALTER TABLE payments DROP CONSTRAINT IF EXISTS payments_refundable,
    ADD CONSTRAINT payments_refundable CHECK (refunded_minor >= 0 AND refund_held_minor >= 0
        AND refunded_minor + refund_held_minor <= CASE WHEN capture_manual THEN captured_minor ELSE amount_minor END);
-- A manual payment's create request is answered when it is authorized.
ALTER TABLE idempotency_records DROP CONSTRAINT IF EXISTS idempotency_records_outcome_check,
    ADD CONSTRAINT idempotency_records_outcome_check CHECK (outcome IN ('succeeded', 'failed', 'requires_capture'));
CREATE TABLE IF NOT EXISTS payment_commands (
    merchant_id     uuid        NOT NULL REFERENCES merchants (id),
    idempotency_key text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    id              uuid        NOT NULL UNIQUE,
    payment_id      uuid        NOT NULL REFERENCES payments (id),
    kind            text        NOT NULL CHECK (kind IN ('capture', 'cancel')),
    request_hash    text        NOT NULL,
    amount_minor    bigint      NOT NULL CHECK (amount_minor >= 0),
    locked_until    timestamptz,
    response_status int,
    response_body   bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (merchant_id, idempotency_key),
    CHECK ((response_status IS NULL) = (response_body IS NULL))
);

-- The authorizations that hold a payer's money, each until its capture or cancel: what the
-- metrics count (open, overdue, unknown), without an index on payments.status that would keep
-- every payment's status update from being HOT.
CREATE TABLE IF NOT EXISTS open_authorizations (
    payment_id     uuid        PRIMARY KEY REFERENCES payments (id),
    capture_before timestamptz NOT NULL
);

-- +goose Down
-- What a manual payment captured bounds its refunds: a database that made one cannot go back.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM payments WHERE capture_manual) THEN
        RAISE EXCEPTION 'manual payments exist: their captured amounts bound their refunds, so migration 22 cannot be undone';
    END IF;
END $$;
-- +goose StatementEnd
DROP TABLE IF EXISTS open_authorizations;
DROP TABLE IF EXISTS payment_commands;
ALTER TABLE idempotency_records DROP CONSTRAINT IF EXISTS idempotency_records_outcome_check,
    ADD CONSTRAINT idempotency_records_outcome_check CHECK (outcome IN ('succeeded', 'failed'));
ALTER TABLE payments DROP CONSTRAINT IF EXISTS payments_capture,
    DROP CONSTRAINT IF EXISTS payments_refundable,
    ADD CONSTRAINT payments_refundable CHECK (refunded_minor >= 0 AND refund_held_minor >= 0
        AND refunded_minor + refund_held_minor <= amount_minor);
ALTER TABLE payments DROP CONSTRAINT IF EXISTS payments_failure,
    ADD CONSTRAINT payments_failure CHECK ((status = 'failed') = (failure_code IS NOT NULL));
ALTER TABLE payments DROP CONSTRAINT IF EXISTS payments_status_check,
    ADD CONSTRAINT payments_status_check CHECK (status IN ('processing', 'succeeded', 'failed', 'unknown'));
ALTER TABLE payments DROP COLUMN IF EXISTS captured_minor, DROP COLUMN IF EXISTS capture_before,
    DROP COLUMN IF EXISTS capture_manual;
