-- +goose Up
-- Events keep their order per payment at every hop (outbox -> JetStream -> inbox -> merchant):
-- the relay publishes only the oldest unpublished event of each aggregate, the webhook consumer
-- waits for an aggregate's earlier events, and the sender delivers one event per aggregate at a
-- time. The first two look events up by aggregate.
CREATE INDEX outbox_aggregate ON outbox (aggregate_id, created_at, id);
-- Retention deletes published rows in small batches, oldest first.
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;
CREATE INDEX inbox_processed ON inbox (processed_at);

-- One row per (event, merchant endpoint): the job the webhook sender works through. id is the event
-- id (the outbox row id, the broker's message id): the same on every attempt and in Kasa-Event-Id.
-- body is kept as the exact bytes that are signed and sent, every time.
--   pending   -> delivered (a 2xx) | failed (retries exhausted)
--   skipped   the merchant had no webhook_url when the event arrived (nothing is sent)
-- A sender claims a due pending row by setting claimed_until (its lease) and counting the attempt;
-- a crashed sender's row becomes due again when the lease runs out. next_attempt_at is when the
-- next attempt is due (exponential backoff with jitter); retry_since starts the retry window
-- (creation, or the last manual redelivery), which the sender keeps open for at least 24 h.
CREATE TABLE webhook_deliveries (
    id               uuid        PRIMARY KEY,
    merchant_id      uuid        NOT NULL REFERENCES merchants (id),
    aggregate_id     uuid        NOT NULL,
    event_type       text        NOT NULL,
    event_created_at timestamptz NOT NULL,
    url              text,
    body             bytea       NOT NULL,
    status           text        NOT NULL CHECK (status IN ('pending', 'delivered', 'failed', 'skipped')),
    attempts         int         NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    claimed_until    timestamptz,
    retry_since      timestamptz NOT NULL DEFAULT now(),
    last_status_code int,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    CONSTRAINT webhook_deliveries_url CHECK (status = 'skipped' OR url IS NOT NULL)
);
-- The sender's poll: due pending rows.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
-- Per-aggregate order: an event waits while an earlier one of its aggregate is pending.
CREATE INDEX webhook_deliveries_aggregate ON webhook_deliveries (aggregate_id, event_created_at, id) WHERE status = 'pending';
-- In-flight attempts per merchant (the sender's per-merchant limit).
CREATE INDEX webhook_deliveries_claimed ON webhook_deliveries (merchant_id)
    WHERE status = 'pending' AND claimed_until IS NOT NULL;
-- The admin listing: a merchant's recent deliveries (ids are time-ordered).
CREATE INDEX webhook_deliveries_merchant ON webhook_deliveries (merchant_id, id DESC);

-- Every attempt, as the sender saw it: HTTP status (NULL when no answer), error, duration.
CREATE TABLE webhook_attempts (
    id           uuid        PRIMARY KEY,
    delivery_id  uuid        NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt      int         NOT NULL CHECK (attempt > 0),
    started_at   timestamptz NOT NULL,
    duration_ms  int         NOT NULL CHECK (duration_ms >= 0),
    status_code  int,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_attempts_delivery ON webhook_attempts (delivery_id, attempt);

-- +goose Down
DROP TABLE webhook_attempts, webhook_deliveries;
DROP INDEX inbox_processed, outbox_published, outbox_aggregate;
