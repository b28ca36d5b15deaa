-- Captures and cancels of manual payments, each under the merchant's Idempotency-Key.

-- name: InsertCommand :one
-- The key's first request owns the command, leased while it runs; a key seen before inserts
-- nothing (no row: read it with GetCommand).
INSERT INTO payment_commands (merchant_id, idempotency_key, id, payment_id, kind, request_hash, amount_minor, locked_until)
VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $8::interval)
ON CONFLICT (merchant_id, idempotency_key) DO NOTHING
RETURNING *;

-- name: GetCommand :one
SELECT * FROM payment_commands WHERE merchant_id = $1 AND idempotency_key = $2;

-- name: LeaseCommand :execrows
-- A retry takes an unanswered command over once its lease ran out: its earlier request gave up.
UPDATE payment_commands SET locked_until = now() + @lease::interval, updated_at = now()
WHERE merchant_id = @merchant_id AND idempotency_key = @idempotency_key AND response_status IS NULL
AND (locked_until IS NULL OR locked_until < now());

-- name: AnswerCommand :exec
-- The command's answer, stored once: every later request with its key repeats it.
UPDATE payment_commands SET response_status = coalesce(response_status, @response_status::int),
response_body = coalesce(response_body, @response_body::bytea), locked_until = NULL, updated_at = now()
WHERE merchant_id = @merchant_id AND idempotency_key = @idempotency_key;

-- name: UnleaseCommand :exec
UPDATE payment_commands SET locked_until = NULL, updated_at = now()
WHERE merchant_id = $1 AND idempotency_key = $2 AND response_status IS NULL;

-- name: DeleteCommand :exec
-- A refused command changed nothing: its key is free again (never an answered one, nor one the
-- workflow took: that one moved the money).
DELETE FROM payment_commands WHERE merchant_id = $1 AND idempotency_key = $2 AND response_status IS NULL AND NOT taken;

-- name: TakeCommand :exec
-- The command the payment's workflow took: marked with the money it moved.
UPDATE payment_commands SET taken = true, updated_at = now() WHERE id = $1;

-- name: TakenCommand :one
SELECT id FROM payment_commands WHERE payment_id = $1 AND taken;

-- name: CaptureInFlight :one
-- A capture the payment's workflow has not finished: accepted (or sent) and not yet what moved
-- its money. A refused one was deleted; one the workflow took is marked taken.
SELECT EXISTS (SELECT 1 FROM payment_commands WHERE payment_id = $1 AND kind = 'capture' AND NOT taken);

-- name: CaptureAmountsInFlight :many
-- The amounts asked by the payment's captures in flight (one, unless a refused one is on its way
-- out), a capture of all that is capturable as the payment's amount.
SELECT (CASE c.amount_minor WHEN 0 THEN p.amount_minor ELSE c.amount_minor END)::bigint AS amount_minor
FROM payment_commands c JOIN payments p ON p.id = c.payment_id
WHERE c.payment_id = $1 AND c.kind = 'capture' AND NOT c.taken;

-- name: CaptureClosed :many
-- The payments among ids that take no capture now although they may read requires_capture: a
-- capture or cancel is under way (sent to the workflow, and not yet marked as what decided the
-- payment), or the capture window is over by the database's clock.
SELECT p.id FROM payments p
WHERE p.id = ANY(@ids::uuid[]) AND p.capture_manual
AND (p.capture_before <= now() OR EXISTS (SELECT 1 FROM payment_commands c WHERE c.payment_id = p.id AND NOT c.taken));
