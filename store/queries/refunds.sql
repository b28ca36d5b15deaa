-- Refunds: the request's hold on the payment, the workflow's steps (the hold on the merchant's
-- settlement account, then post or release) and the readers. A refund is read whole (SELECT *,
-- RETURNING *) and turned into a payment.Refund by store.refundOf, as a payment is.

-- name: LockRefundedPayment :one
-- The payment a refund is asked for, locked until the refund's transaction ends: what is
-- refundable is read from its newest version, and the hold below cannot fail for a concurrent one.
-- A manual payment refunds what was captured; an automatic one, its amount.
SELECT id, account_id, CASE WHEN capture_manual THEN captured_minor ELSE amount_minor END::bigint AS amount_minor,
  currency, status, refunded_minor, refund_held_minor
FROM payments WHERE id = $1 AND merchant_id = $2 FOR UPDATE;

-- name: HoldPaymentRefund :one
-- The refundable amount's guard, with the table's CHECK behind it.
UPDATE payments SET refund_held_minor = refund_held_minor + @amount::bigint
WHERE id = @id AND status = 'succeeded' AND @amount::bigint > 0
  AND refunded_minor + refund_held_minor + @amount::bigint <= CASE WHEN capture_manual THEN captured_minor ELSE amount_minor END
RETURNING refund_held_minor;

-- name: InsertRefund :one
INSERT INTO refunds (id, payment_id, merchant_id, idempotency_key, account_id, amount_minor, currency, reason, status)
VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, ''), 'processing')
RETURNING created_at, updated_at;

-- name: GetRefund :one
SELECT * FROM refunds WHERE id = $1;

-- name: GetRefundByKey :one
SELECT * FROM refunds WHERE merchant_id = $1 AND idempotency_key = $2
-- A key whose record expired may name a newer refund: the newest is the key's.
ORDER BY created_at DESC, id DESC LIMIT 1;

-- name: RefundIDByKey :one
-- The refund a merchant's key made, whether or not its idempotency record is still kept.
SELECT id FROM refunds WHERE merchant_id = $1 AND idempotency_key = $2 ORDER BY created_at, id LIMIT 1;

-- name: PaymentRefunds :many
-- Newest first; after a refund ($2, the previous page's last) the ones older than it. The
-- caller asks for one more than the page to learn whether there are more.
SELECT r.* FROM refunds r
WHERE r.payment_id = sqlc.arg(payment_id)
  AND (sqlc.narg(after)::uuid IS NULL OR (r.created_at, r.id) <
       (SELECT a.created_at, a.id FROM refunds a WHERE a.id = sqlc.narg(after) AND a.payment_id = sqlc.arg(payment_id)))
ORDER BY r.created_at DESC, r.id DESC
LIMIT sqlc.arg(max_rows);

-- name: RefundOfPayment :one
SELECT EXISTS (SELECT 1 FROM refunds WHERE id = $1 AND payment_id = $2);

-- name: StartRefundHold :one
-- The refund workflow's first step records that the workflow runs, and which run, and reads what
-- the hold needs: the refund's amount and status, the merchant's settlement account in its
-- currency (NULL when it has none), whether the refund is held already, and the run that took
-- the refund on.
WITH rec AS (
  SELECT i.run_id FROM idempotency_records i WHERE i.operation_id = $1
), started AS (
  UPDATE idempotency_records SET workflow_started = true, locked_until = NULL, queued = false, run_id = $2, updated_at = now()
  WHERE idempotency_records.operation_id = $1 AND NOT workflow_started
  RETURNING run_id
)
SELECT rf.amount_minor, rf.status, coalesce(rf.failure_code, '')::text AS failure_code, a.id AS settlement_id,
  EXISTS (SELECT 1 FROM balance_reservations br WHERE br.operation_id = rf.id) AS held,
  coalesce((SELECT run_id FROM started), (SELECT run_id FROM rec), '')::text AS run_of_record
FROM refunds rf
LEFT JOIN accounts a ON a.merchant_id = rf.merchant_id AND a.currency = rf.currency AND a.kind = 'settlement'
WHERE rf.id = $1
-- Locked until the hold's transaction ends: a release of the refund (another attempt's
-- insufficient funds) waits for it, or it for the release and then reads the failed status.
FOR NO KEY UPDATE OF rf;

-- name: InsertReservation :exec
INSERT INTO balance_reservations (id, operation_id, account_id, amount_minor, status) VALUES ($1, $2, $3, $4, 'active');

-- name: SetRefundStatus :one
-- unknown_at is when it became unknown, kept once settled (reconciliation's window ends there).
-- One an earlier release made unknown has none: its updated_at is that moment.
UPDATE refunds SET status = $2, failure_code = NULLIF($3, ''),
provider_reference = coalesce(NULLIF($4, ''), provider_reference), updated_at = now(),
unknown_at = CASE WHEN $2 = 'unknown' THEN now() ELSE coalesce(unknown_at, CASE WHEN status = 'unknown' THEN updated_at END) END
WHERE id = $1 AND status = ANY($5::text[])
RETURNING *;

-- name: PostPaymentRefund :execrows
-- A succeeded refund's amount moves from held to refunded.
UPDATE payments SET refund_held_minor = refund_held_minor - @amount::bigint,
  refunded_minor = refunded_minor + @amount::bigint, updated_at = now()
WHERE id = @id AND refund_held_minor >= @amount::bigint;

-- name: ReleasePaymentRefund :execrows
UPDATE payments SET refund_held_minor = refund_held_minor - @amount::bigint
WHERE id = @id AND refund_held_minor >= @amount::bigint;

-- name: BeginRefundAttempt :one
UPDATE refunds SET send_attempts = send_attempts + 1 WHERE id = $1 RETURNING send_attempts;

-- name: BeginRefundSend :execrows
-- Records that the workflow's send number @send is about to go out; no row when it already was.
UPDATE refunds SET send_attempts = @send::int WHERE id = @id AND send_attempts < @send::int;

-- name: FlagRefundStuck :execrows
-- An empty reason clears the flag.
UPDATE refunds SET stuck_since = CASE WHEN @reason::text = '' THEN NULL ELSE coalesce(stuck_since, now()) END,
  stuck_reason = NULLIF(@reason::text, '')
WHERE id = @id;
