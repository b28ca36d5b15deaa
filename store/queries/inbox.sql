-- A consumer's inbox: each message's effect happens once.

-- name: PurgeInbox :execrows
-- A row goes only once its outbox row has: the webhook consumer takes from the outbox the earlier
-- events of a payment that its inbox lacks, and would record and deliver again an old event whose
-- outbox row a pass found too recent (its statement runs first, with an earlier cutoff).
DELETE FROM inbox WHERE (consumer, message_id) IN (SELECT i.consumer, i.message_id FROM inbox i
WHERE i.processed_at < now() - $1::float8 * interval '1 second'
  AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.id = i.message_id)
ORDER BY i.processed_at LIMIT $2);

-- name: AcceptEvent :one
-- One event through a consumer's inbox, in one statement: the inbox row, and the delivery only
-- with a new inbox row. The consumer records an aggregate's events in order, earlier ones it took
-- from the outbox first (events.sql). A row another consumer is inserting makes this one wait for
-- its commit, so an earlier event's delivery is committed first whichever consumer records it.
-- The last column says whether the delivery existed before (the inbox row was purged, it was
-- not). The aggregate is a payment or a refund: either names the merchant to deliver to.
WITH inboxed AS (
  INSERT INTO inbox (consumer, message_id) VALUES ($6, $1)
  ON CONFLICT DO NOTHING RETURNING 1
), delivered AS (
  INSERT INTO webhook_deliveries (id, merchant_id, aggregate_id, event_type, event_created_at, url, body, status)
  SELECT $1, agg.merchant_id, agg.id, $3, $4, m.webhook_url, $5,
         CASE WHEN m.webhook_url IS NULL THEN 'skipped' ELSE 'pending' END
  FROM (SELECT p.id, p.merchant_id FROM payments p WHERE p.id = $2
        UNION ALL SELECT r.id, r.merchant_id FROM refunds r WHERE r.id = $2) agg
  JOIN merchants m ON m.id = agg.merchant_id
  WHERE $5::bytea IS NOT NULL AND EXISTS (SELECT 1 FROM inboxed)
  ON CONFLICT (id) DO NOTHING RETURNING status
)
SELECT EXISTS (SELECT 1 FROM inboxed), coalesce((SELECT status FROM delivered), ''),
       EXISTS (SELECT 1 FROM webhook_deliveries wd WHERE wd.id = $1);
