-- Lists: a merchant's payments, newest first, one keyset page at a time.

-- name: PaymentCursor :one
-- Where a page starts: the payment it starts after, if it is the merchant's.
SELECT created_at FROM payments WHERE id = $1 AND merchant_id = $2;

-- name: ListPayments :many
-- Rows strictly before ($3, $4) in (created_at, id) order and created at or after $2, newest
-- first, at most $5 of them: the caller folds the cursor and created_lt into the one upper
-- bound, so the statement keeps one shape and its generic plan is its custom plan.
SELECT id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id, payment_type,
status, coalesce(failure_code, '') AS failure_code, coalesce(provider_reference, '') AS provider_reference,
created_at, updated_at, refunded_minor FROM payments
WHERE merchant_id = $1 AND created_at >= $2::timestamptz AND (created_at, id) < ($3::timestamptz, $4::uuid)
ORDER BY created_at DESC, id DESC LIMIT $5;

-- name: ListPaymentsWithStatus :many
-- ListPayments of the payments with status $6.
SELECT id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id, payment_type,
status, coalesce(failure_code, '') AS failure_code, coalesce(provider_reference, '') AS provider_reference,
created_at, updated_at, refunded_minor FROM payments
WHERE merchant_id = $1 AND status = $6 AND created_at >= $2::timestamptz AND (created_at, id) < ($3::timestamptz, $4::uuid)
ORDER BY created_at DESC, id DESC LIMIT $5;
