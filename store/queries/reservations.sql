-- Balance reservations: the hold on the payer's account while a payment is in flight.

-- name: ReserveFunds :one
-- Reserve in one statement, so one round trip and no explicit transaction. The workflow's
-- first step also records that the workflow runs, and which run ($3): from now on the lease of
-- the idempotency record no longer matters (no takeover, no sweep). The balance check and the
-- hold are one UPDATE: concurrent reservations re-evaluate the condition on the latest row
-- version, so the account can never be overdrawn. A reservation is inserted only with its hold,
-- and only for a processing payment. Of two attempts racing for one payment, the second either
-- holds too and then fails on the reservation's unique operation_id (its whole statement, hold
-- included, is undone), or finds the balance taken by the first hold: Reserve then looks again
-- before calling it a decline.
WITH rec AS (
  SELECT i.run_id FROM idempotency_records i WHERE i.operation_id = $1
), started AS (
  UPDATE idempotency_records SET workflow_started = true, locked_until = NULL, queued = false, run_id = $3, updated_at = now()
  WHERE idempotency_records.operation_id = $1 AND NOT workflow_started
  RETURNING run_id
), p AS (
  -- Locked: the status read here is the one the hold goes by. A Release of the payment (another
  -- attempt's insufficient funds) waits for this statement, or this one for it and then reads
  -- its failed status; unlocked, an attempt blocked on the payer's row would hold for a failed one.
  SELECT id, account_id, amount_minor, status FROM payments WHERE id = $1 FOR NO KEY UPDATE
), existing AS (
  SELECT 1 FROM balance_reservations r WHERE r.operation_id = $1
), held AS (
  UPDATE accounts a SET reserved = a.reserved + p.amount_minor, updated_at = now()
  FROM p WHERE a.id = p.account_id AND p.status = 'processing' AND a.balance - a.reserved >= p.amount_minor
    AND NOT EXISTS (SELECT 1 FROM existing)
  RETURNING a.id
), inserted AS (
  INSERT INTO balance_reservations (id, operation_id, account_id, amount_minor, status)
  SELECT $2, p.id, p.account_id, p.amount_minor, 'active' FROM p, held
  RETURNING id
)
SELECT EXISTS (SELECT 1 FROM p) AS found, EXISTS (SELECT 1 FROM existing) AS already, EXISTS (SELECT 1 FROM inserted) AS reserved,
  coalesce((SELECT status FROM p), '')::text AS status,
  coalesce((SELECT run_id FROM started), (SELECT run_id FROM rec), '')::text AS run_of_record;

-- name: ReservationExists :one
SELECT EXISTS (SELECT 1 FROM balance_reservations WHERE operation_id = $1);

-- name: CloseReservation :one
UPDATE balance_reservations SET status = $2, updated_at = now()
WHERE operation_id = $1 AND status = 'active' RETURNING account_id, amount_minor;

-- name: Unreserve :exec
UPDATE accounts SET reserved = reserved - $2, updated_at = now() WHERE id = $1;

-- name: LockPaymentRow :exec
-- Taken first by a step that must see every hold the payment has: a Reserve still running
-- commits its hold before the step's next statement reads (ReserveFunds locks the same row).
SELECT 1 FROM payments WHERE id = $1 FOR NO KEY UPDATE;
