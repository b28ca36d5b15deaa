-- Reconciliation: payments and refunds by the references of a settlement file, the payments
-- and refunds a settlement file's days should have listed, and the finished runs.

-- name: PaymentsByID :many
SELECT * FROM payments WHERE id = ANY($1::uuid[]);

-- name: PaymentsCreated :many
-- Without merchants ($4 NULL) every merchant's payments. Payment ids are UUIDv7, minted
-- when the payment is created, so a range of ids ($5, $6: the day widened by idClockSkew
-- for the app's clock against the database's) is a range scan of the primary key, and
-- payments needs no index on created_at.
-- decided_at is when the payment left processing, which its settlement window runs to. An
-- unknown payment's updated_at is that (only settling it moves it again), and one settled later
-- keeps it as unknown_at: kasa sent nothing after it, whenever the settlement came. A refund
-- moves a succeeded one's updated_at: its payment posting, written in the transaction that made
-- it succeed and immutable, keeps the time. Only a refunded payment needs the posting read, and
-- a manual one, captured when its posting was written.
SELECT p.*,
(CASE WHEN p.status = 'succeeded' AND p.unknown_at IS NOT NULL THEN p.unknown_at
  WHEN p.status = 'succeeded' AND (p.refunded_minor > 0 OR p.capture_manual) THEN coalesce((SELECT l.created_at FROM ledger_postings l
  WHERE l.kind = 'payment' AND l.reference = p.id::text), p.updated_at) ELSE p.updated_at END)::timestamptz AS decided_at
FROM payments p
WHERE p.id >= $5 AND p.id < $6 AND p.created_at >= $1 AND p.created_at < $2 AND p.status = ANY($3::text[])
AND ($4::uuid[] IS NULL OR p.merchant_id = ANY($4::uuid[]))
ORDER BY p.created_at, p.id;

-- name: CapturesDecided :many
-- Manual payments created before $1, with a status of $3, whose capture or void was decided in
-- [$1, $2), after the authorization's day. One became unknown then (its authorization is open:
-- open_authorizations, a small table, finds it without an index on payments), or became unknown
-- then and was settled as captured later (payments_manual_unknown_at), or its capture succeeded
-- (its posting was written then: the postings' UUIDv7 ids, $5 and $6, bound that as
-- PaymentsCreated's do; a posting of a capture settled after it became unknown is not when it
-- was decided). sent_from is when the capture or void may first have been sent: its first
-- capture's or cancel's arrival, else capture_before (kasa voided it then).
SELECT p.*, d.decided_at::timestamptz AS decided_at,
coalesce((SELECT min(c.created_at) FROM payment_commands c WHERE c.payment_id = p.id), p.capture_before)::timestamptz AS sent_from
FROM (
  SELECT a.payment_id, q.updated_at AS decided_at, false AS posted FROM open_authorizations a JOIN payments q ON q.id = a.payment_id
  WHERE 'unknown' = ANY($3::text[]) AND q.status = 'unknown' AND q.updated_at >= $1 AND q.updated_at < $2
  UNION ALL
  SELECT q.id, q.unknown_at, false FROM payments q
  WHERE 'succeeded' = ANY($3::text[]) AND q.capture_manual AND q.unknown_at IS NOT NULL AND q.unknown_at >= $1 AND q.unknown_at < $2
  AND q.status = 'succeeded'
  UNION ALL
  SELECT CASE WHEN l.kind = 'payment' THEN l.reference::uuid END, l.created_at, true FROM ledger_postings l
  WHERE 'succeeded' = ANY($3::text[]) AND l.id >= $5 AND l.id < $6 AND l.kind = 'payment' AND l.created_at >= $1 AND l.created_at < $2
) d JOIN payments p ON p.id = d.payment_id
WHERE p.capture_manual AND p.status = ANY($3::text[]) AND p.provider_reference <> '' AND p.created_at < $1
AND NOT (d.posted AND p.unknown_at IS NOT NULL)
AND ($4::uuid[] IS NULL OR p.merchant_id = ANY($4::uuid[]))
ORDER BY d.decided_at, p.id;

-- name: RefundsByID :many
SELECT * FROM refunds WHERE id = ANY($1::uuid[]);

-- name: RefundsCreated :many
-- As PaymentsCreated: refund ids are UUIDv7 too, so the day is a range scan of the primary key.
-- A refund's updated_at moves only with its status: it is when its outcome was decided, unless
-- it was unknown and settled since (unknown_at).
SELECT r.*, coalesce(r.unknown_at, r.updated_at)::timestamptz AS decided_at FROM refunds r
WHERE r.id >= $5 AND r.id < $6 AND r.created_at >= $1 AND r.created_at < $2 AND r.status = ANY($3::text[])
AND ($4::uuid[] IS NULL OR r.merchant_id = ANY($4::uuid[]))
ORDER BY r.created_at, r.id;

-- name: InsertReconciliationRun :exec
INSERT INTO reconciliation_runs
(id, source, days, lines, matched, resolved_charged, resolved_not_charged, pending, mismatches, report)
VALUES ($1, $2, $3::date[], $4, $5, $6, $7, $8, $9, $10);

-- name: ReconcileTotals :one
-- One row a day or so: summing them at scrape time is cheap for decades.
SELECT count(*), coalesce(sum(lines), 0), coalesce(sum(matched), 0),
  coalesce(sum(resolved_charged), 0), coalesce(sum(resolved_not_charged), 0), coalesce(sum(pending), 0),
  coalesce(sum(mismatches), 0), coalesce(max(finished_at), 'epoch'),
  coalesce((SELECT mismatches FROM reconciliation_runs ORDER BY finished_at DESC, id DESC LIMIT 1), 0)
FROM reconciliation_runs;

-- name: RecordSettlementListings :exec
-- The days a settlement file lists these payments (kind charge) or refunds on; a day listed before
-- is kept as it was. Inserted in key order, whatever order the caller has: two imports of one
-- file wait for each other's rows one way only, never in a cycle (a deadlock).
INSERT INTO settlement_listings (kind, reference, day)
SELECT @kind::text, unnest(@refs::uuid[]), unnest(@days::date[])
ORDER BY 2, 3
ON CONFLICT DO NOTHING;

-- name: SettlementListings :many
-- Every day an import listed these payments (kind charge) or refunds on.
SELECT reference, day FROM settlement_listings WHERE kind = @kind::text AND reference = ANY(@refs::uuid[]);

-- name: RecordSettlementCompletions :exec
-- The days an import proved complete for these merchants' payments (kind charge) or refunds
-- (the nil uuid: every merchant, kept as NULL), each up to its as_of; a day recorded before is
-- kept as it was. Inserted in key order, as the listings are.
INSERT INTO settlement_completions (kind, day, merchant_id, as_of)
SELECT @kind::text, unnest(@days::date[]), nullif(unnest(@merchants::uuid[]), '00000000-0000-0000-0000-000000000000'),
unnest(@as_of::timestamptz[])
ORDER BY 2, 3, 4
ON CONFLICT DO NOTHING;

-- name: SettlementCompletions :many
-- For each of days, how far an import proved it complete for the payments (kind charge) or refunds
-- of each of merchants, or of every merchant (merchant_id NULL).
SELECT day, merchant_id, max(as_of)::timestamptz AS as_of FROM settlement_completions
WHERE kind = @kind::text AND day = ANY(@days::date[]) AND (merchant_id IS NULL OR merchant_id = ANY(@merchants::uuid[]))
GROUP BY day, merchant_id;
