-- Payments: the operation's row, its status moves and its charge attempts.
--
-- A query that reads a payment reads the whole row (SELECT *, RETURNING *), which sqlc spells
-- out in the table's column order and store.paymentOf turns into a payment.Payment: a column is
-- named once, in its migration.

-- name: InsertPayment :one
-- Guarded by the record: only the operation that acquired the key gets a payment row. It is
-- created when its record is: the lists of open payments read the record's created_at in the
-- payments' order. A manual payment must be captured within the window ($10) from then.
INSERT INTO payments (id, merchant_id, idempotency_key, account_id, amount_minor, currency, invoice_id, payment_type, status, created_at,
  capture_manual, capture_before)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, 'processing', r.created_at, $9::boolean,
  CASE WHEN $9::boolean THEN r.created_at + $10::interval END
FROM idempotency_records r WHERE r.operation_id = $1
RETURNING created_at, updated_at, capture_before;

-- name: LivePayment :one
-- A live payment (processing, unknown or succeeded) is one without a failure: the business
-- key's predicate.
SELECT id FROM payments WHERE merchant_id = $1 AND invoice_id = $2 AND payment_type = $3
AND failure_code IS NULL;

-- name: GetPayment :one
SELECT * FROM payments WHERE id = $1;

-- name: GetPaymentByKey :one
SELECT * FROM payments WHERE merchant_id = $1 AND idempotency_key = $2
-- A key whose record expired may name a newer payment: the newest is the key's.
ORDER BY created_at DESC, id DESC LIMIT 1;

-- name: SetPaymentStatus :one
-- unknown_at is when it last became unknown, kept once settled (reconciliation's window ends
-- there); an authorization found, waiting for its capture again, starts a new step without one.
-- One an earlier release made unknown has none: its updated_at is that moment (only settling
-- moves an unknown payment).
UPDATE payments SET status = $2, failure_code = NULLIF($3, ''),
provider_reference = coalesce(NULLIF($4, ''), provider_reference), updated_at = now(),
unknown_at = CASE $2 WHEN 'unknown' THEN now() WHEN 'requires_capture' THEN NULL
  ELSE coalesce(unknown_at, CASE WHEN status = 'unknown' THEN updated_at END) END
WHERE id = $1 AND status = ANY($5::text[]) RETURNING *;

-- name: SetPaymentStatusSettlement :one
-- SetPaymentStatus that also returns the merchant's settlement account in the payment's currency
-- (NULL if it has none), which the capture credits.
UPDATE payments SET status = $2, failure_code = NULLIF($3, ''),
provider_reference = coalesce(NULLIF($4, ''), provider_reference), updated_at = now(),
unknown_at = CASE $2 WHEN 'unknown' THEN now() WHEN 'requires_capture' THEN NULL
  ELSE coalesce(unknown_at, CASE WHEN status = 'unknown' THEN updated_at END) END
WHERE payments.id = $1 AND payments.status = ANY($5::text[]) RETURNING payments.*, (SELECT a.id FROM accounts a
WHERE a.merchant_id = payments.merchant_id AND a.currency = payments.currency AND a.kind = 'settlement') AS settlement_id;

-- name: BeginChargeAttempt :one
UPDATE payments SET charge_attempts = charge_attempts + 1 WHERE id = $1 RETURNING charge_attempts;

-- name: BeginChargeSend :execrows
-- Records that the workflow's send number $2 is about to go out; no row when it already was.
UPDATE payments SET charge_attempts = @send::int WHERE id = @id AND charge_attempts < @send::int;

-- name: FlagStuck :execrows
-- An empty reason clears the flag.
UPDATE payments SET stuck_since = CASE WHEN @reason::text = '' THEN NULL ELSE coalesce(stuck_since, now()) END,
  stuck_reason = NULLIF(@reason::text, '')
WHERE id = @id;

-- name: CapturePayment :one
-- A manual payment's capture: it becomes succeeded with what was captured. Returns the row and
-- the merchant's settlement account in its currency (NULL if it has none), which the capture credits.
UPDATE payments SET status = 'succeeded', captured_minor = @captured::bigint,
provider_reference = coalesce(NULLIF(@provider_reference::text, ''), provider_reference), updated_at = now(),
unknown_at = coalesce(unknown_at, CASE WHEN status = 'unknown' THEN updated_at END)
WHERE payments.id = @id AND payments.capture_manual AND payments.status IN ('requires_capture', 'unknown')
RETURNING payments.*, (SELECT a.id FROM accounts a
WHERE a.merchant_id = payments.merchant_id AND a.currency = payments.currency AND a.kind = 'settlement') AS settlement_id;

-- name: OpenAuthorization :exec
INSERT INTO open_authorizations (payment_id, capture_before)
SELECT id, capture_before FROM payments WHERE id = $1 AND capture_manual
ON CONFLICT (payment_id) DO NOTHING;

-- name: CloseAuthorization :exec
DELETE FROM open_authorizations WHERE payment_id = $1;

-- name: AuthorizationOpen :one
SELECT EXISTS (SELECT 1 FROM open_authorizations WHERE payment_id = $1);
