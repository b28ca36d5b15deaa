-- Lists: a merchant's payments, newest first, one keyset page at a time.

-- name: PaymentCursor :one
-- Where a page starts: the payment it starts after, if it is the merchant's.
SELECT created_at FROM payments WHERE id = $1 AND merchant_id = $2;

-- name: ListPayments :many
-- Rows strictly before ($3, $4) in (created_at, id) order and created at or after $2, newest
-- first, at most $5 of them: the caller folds the cursor and created_lt into the one upper
-- bound, so the statement keeps one shape and its generic plan is its custom plan.
SELECT * FROM payments
WHERE merchant_id = $1 AND created_at >= $2::timestamptz AND (created_at, id) < ($3::timestamptz, $4::uuid)
ORDER BY created_at DESC, id DESC LIMIT $5;

-- name: ListPaymentsWithStatus :many
-- ListPayments of the payments with status $6, for a common status (succeeded): filtering the
-- merchant's payments in order finds them at once. payments has no index naming the status,
-- so that a payment's success is updated in place.
SELECT * FROM payments
WHERE merchant_id = $1 AND status = $6 AND created_at >= $2::timestamptz AND (created_at, id) < ($3::timestamptz, $4::uuid)
ORDER BY created_at DESC, id DESC LIMIT $5;

-- name: ListFailedPayments :many
-- ListPayments of the failed payments (those with a failure code that are not canceled), along
-- their own index.
SELECT * FROM payments
WHERE merchant_id = $1 AND failure_code IS NOT NULL AND status = 'failed' AND created_at >= $2::timestamptz AND (created_at, id) < ($3::timestamptz, $4::uuid)
ORDER BY created_at DESC, id DESC LIMIT $5;

-- name: ListUnknownPayments :many
-- ListOpenPayments of the unknown payments, with the manual payments whose capture or void is
-- unknown: their records completed when they were authorized, and their authorizations are
-- open. Both halves read few rows.
(SELECT p.*
FROM idempotency_records r JOIN payments p ON p.id = r.operation_id
WHERE r.merchant_id = $1 AND r.scope = 'payment' AND r.status <> 'completed' AND r.status = $6
  AND r.created_at >= $2::timestamptz AND (r.created_at, r.operation_id) < ($3::timestamptz, $4::uuid)
  AND p.status = $6
ORDER BY r.created_at DESC, r.operation_id DESC LIMIT $5)
UNION ALL
(SELECT p.* FROM open_authorizations a JOIN payments p ON p.id = a.payment_id
WHERE p.status = $6 AND p.merchant_id = $1
  AND p.created_at >= $2::timestamptz AND (p.created_at, p.id) < ($3::timestamptz, $4::uuid))
ORDER BY created_at DESC, id DESC LIMIT $5;

-- name: ListOpenPayments :many
-- ListPayments of the payments with status $6, processing or unknown: rare, so they are found
-- through the merchant's open idempotency records (which follow their payments and are never
-- deleted while open), newest first along the open records' index. A payment is created when
-- its record is and has its operation id, so the record's (created_at, operation_id) is the
-- payment's (created_at, id).
SELECT p.*
FROM idempotency_records r JOIN payments p ON p.id = r.operation_id
WHERE r.merchant_id = $1 AND r.scope = 'payment' AND r.status <> 'completed' AND r.status = $6
  AND r.created_at >= $2::timestamptz AND (r.created_at, r.operation_id) < ($3::timestamptz, $4::uuid)
  AND p.status = $6
ORDER BY r.created_at DESC, r.operation_id DESC LIMIT $5;
