-- Idempotency records: the key's state machine, processing -> completed | unknown (-> completed),
-- with the lease of whoever must start the workflow and the stored answer of a completed operation.

-- name: CustomerAccount :one
SELECT merchant_id, currency FROM accounts WHERE id = $1 AND kind = 'customer';

-- name: AcquireKey :one
-- ON CONFLICT DO NOTHING RETURNING: exactly one concurrent inserter gets a row back and owns
-- the operation; the others read the winner's record. Guarded by the payer account, as Begin
-- sends all three statements at once: an account that is not the merchant's in the
-- request's currency creates nothing.
-- The new record is queued for the backlog's drainer, with no lease, when the caller asks ($8)
-- or when the merchant has queued payments already: a merchant's payments start in the order
-- they arrived.
INSERT INTO idempotency_records (merchant_id, scope, idempotency_key, request_hash, status, operation_id, locked_until, queued)
SELECT $1, 'payment', $2, $3, 'processing', $4, CASE WHEN q.queued THEN NULL ELSE now() + $5::interval END, q.queued
FROM (SELECT $8::boolean OR EXISTS (SELECT 1 FROM idempotency_records WHERE merchant_id = $1 AND queued) AS queued) q
WHERE EXISTS (SELECT 1 FROM accounts WHERE id = $6 AND kind = 'customer' AND merchant_id = $1 AND currency = $7)
ON CONFLICT (merchant_id, scope, idempotency_key) DO NOTHING RETURNING operation_id, queued;

-- name: AcquireRefundKey :one
-- AcquireKey for a refund: a concurrent inserter of the same key waits for the first
-- transaction, then gets no row.
INSERT INTO idempotency_records (merchant_id, scope, idempotency_key, request_hash, status, operation_id, locked_until)
VALUES ($1, 'refund', $2, $3, 'processing', $4, now() + $5::interval)
ON CONFLICT (merchant_id, scope, idempotency_key) DO NOTHING RETURNING operation_id;

-- name: GetRecord :one
SELECT merchant_id, idempotency_key, request_hash, status, operation_id, coalesce(outcome, '') AS outcome,
response_body, coalesce(locked_until, 'epoch') AS locked_until, workflow_started, scope, updated_at, queued
FROM idempotency_records WHERE merchant_id = $1 AND scope = 'payment' AND idempotency_key = $2;

-- name: GetRefundRecord :one
SELECT merchant_id, idempotency_key, request_hash, status, operation_id, coalesce(outcome, '') AS outcome,
response_body, coalesce(locked_until, 'epoch') AS locked_until, workflow_started, scope, updated_at, queued
FROM idempotency_records WHERE merchant_id = $1 AND scope = 'refund' AND idempotency_key = $2;

-- name: TakeOver :one
-- Atomic takeover: only an expired lease of a workflow nobody started can be taken, by one caller.
UPDATE idempotency_records SET locked_until = now() + $3::interval, updated_at = now()
WHERE merchant_id = $1 AND scope = 'payment' AND idempotency_key = $2 AND NOT workflow_started AND locked_until < now()
RETURNING operation_id;

-- name: TakeOverRefund :one
UPDATE idempotency_records SET locked_until = now() + $3::interval, updated_at = now()
WHERE merchant_id = $1 AND scope = 'refund' AND idempotency_key = $2 AND NOT workflow_started AND locked_until < now()
RETURNING operation_id;

-- name: MarkWorkflowStarted :exec
UPDATE idempotency_records SET workflow_started = true, locked_until = NULL, queued = false, updated_at = now()
WHERE operation_id = $1 AND NOT workflow_started;

-- name: ExpireLease :exec
UPDATE idempotency_records SET locked_until = now(), updated_at = now()
WHERE operation_id = $1 AND NOT workflow_started;

-- name: SaveResponse :exec
UPDATE idempotency_records SET outcome = $3, response_body = $4, updated_at = now()
WHERE merchant_id = $1 AND scope = 'payment' AND idempotency_key = $2 AND status = 'completed' AND response_body IS NULL;

-- name: Stranded :many
-- Both scopes: the sweeper starts a stranded refund's workflow as it does a payment's. A record
-- whose workflow was never started is open, so the open records' index finds them. A queued
-- one is the backlog drainer's, which starts a merchant's in order.
SELECT merchant_id, scope, idempotency_key, operation_id FROM idempotency_records
WHERE status <> 'completed' AND NOT workflow_started AND NOT queued AND locked_until < now()
  AND (sqlc.narg(merchant_id)::uuid IS NULL OR merchant_id = sqlc.narg(merchant_id))
ORDER BY locked_until LIMIT sqlc.arg(max_rows);

-- name: CompleteWithEvent :exec
-- The record moves with its operation (a completed one gets its stored answer; an earlier one is
-- kept) and the operation's event is queued, in one statement. A completed record stays so: a
-- manual payment's create request was answered when it was authorized.
WITH event AS (
  INSERT INTO outbox (id, aggregate_id, type, payload) VALUES ($5, $1, $6, $7)
)
UPDATE idempotency_records SET status = CASE WHEN status = 'completed' THEN status ELSE $2 END, outcome = coalesce(outcome, $3),
response_body = coalesce(response_body, $4), queued = false, updated_at = now() WHERE operation_id = $1;
