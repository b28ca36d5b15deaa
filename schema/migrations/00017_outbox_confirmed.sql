-- +goose NO TRANSACTION
-- How far each consumer's inbox is known to hold the published outbox: every row published
-- before (published_at, id) is in the consumer's inbox, or the relay gave up on it. A broker can
-- acknowledge a message and lose it (JetStream fsyncs on a timer), so the relay reads the rows
-- published after this point that the inbox still lacks and publishes them again, and moves the
-- point over the rows the inbox holds. One row per consumer, rewritten in place (only the key is
-- indexed, so the update is HOT); the outbox and inbox get no new column and no new write.
--
-- The relay reads past the point in (published_at, id) order, a page at a time: the index of
-- published rows gains id so that it gives that order itself (an index on published_at alone
-- leaves a sort of everything published since the point). It replaces the old one, which
-- retention's oldest-first deletes read the same way: marking a row published still writes one
-- index entry. Built before the old one is dropped, concurrently: events keep being published.
-- +goose Up
CREATE TABLE IF NOT EXISTS outbox_confirmed (
    consumer      text        PRIMARY KEY,
    published_at  timestamptz NOT NULL,
    id            uuid        NOT NULL
);
-- The webhook consumer is watched from now on; what was published before is not checked.
INSERT INTO outbox_confirmed (consumer, published_at, id)
VALUES ('webhooks', now(), '00000000-0000-0000-0000-000000000000') ON CONFLICT DO NOTHING;
-- A build that a canceled run left invalid is built again.
DROP INDEX CONCURRENTLY IF EXISTS outbox_published_order;
CREATE INDEX CONCURRENTLY outbox_published_order ON outbox (published_at, id)
    WHERE published_at IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS outbox_published;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_published ON outbox (published_at)
    WHERE published_at IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS outbox_published_order;
DROP TABLE IF EXISTS outbox_confirmed;
