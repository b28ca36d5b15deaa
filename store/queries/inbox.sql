-- A consumer's inbox: each message's effect happens once. The webhook consumer defers an event
-- while an earlier event of its aggregate, published recently, is not yet in its inbox (several
-- consumer processes may race otherwise).

-- name: PurgeInbox :execrows
DELETE FROM inbox WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM inbox
WHERE processed_at < now() - $1::float8 * interval '1 second' ORDER BY processed_at LIMIT $2);

-- name: AcceptEvent :one
-- One event through a consumer's inbox, in one statement. It waits (writes nothing) while an
-- earlier event of the aggregate, published within the grace period (or not yet published),
-- has not been through this inbox. The grace runs from this event's publication too: an earlier
-- event the broker lost while it was down is published again after the later ones it held back
-- (the relay looks for lost events less often than for new ones). The inbox row goes in only
-- then, and the delivery only with a new inbox row. Every part reads the statement's snapshot,
-- which holds the batch's earlier statements: an earlier event of the same batch counts as
-- processed. The last column says whether the delivery existed before (the inbox row was
-- purged, it was not). The aggregate is a payment or a refund: either names the merchant to
-- deliver to.
WITH waiting AS (
  SELECT EXISTS (SELECT 1 FROM outbox o
    WHERE o.aggregate_id = $2 AND (o.created_at, o.id) < ($4, $1)
      AND greatest(coalesce(o.published_at, o.created_at),
                   coalesce((SELECT l.published_at FROM outbox l WHERE l.id = $1), now())) > now() - $7::float8 * interval '1 second'
      AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.consumer = $6 AND i.message_id = o.id)) AS w
), inboxed AS (
  INSERT INTO inbox (consumer, message_id) SELECT $6, $1 FROM waiting WHERE NOT w
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
SELECT (SELECT w FROM waiting), EXISTS (SELECT 1 FROM inboxed), coalesce((SELECT status FROM delivered), ''),
       EXISTS (SELECT 1 FROM webhook_deliveries wd WHERE wd.id = $1);
