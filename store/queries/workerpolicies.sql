-- name: LockWorkerPolicies :exec
-- Serialises the starting workers of a queue until the transaction ends: each then sees the
-- policy the one before it wrote, so two with different settings cannot both pass the check.
SELECT pg_advisory_xact_lock(hashtextextended('worker_policies/' || @task_queue::text, 0));

-- name: WorkerPolicyConflict :one
-- A policy other than the one given that a worker on the queue reported since @since.
SELECT capability, booking_window_ms, charge_budget_ms, charge_timeout_ms FROM worker_policies
WHERE task_queue = @task_queue AND last_seen >= @since
  AND (capability, booking_window_ms, charge_budget_ms, charge_timeout_ms) IS DISTINCT FROM
      (@capability::text, @booking_window_ms::bigint, @charge_budget_ms::bigint, @charge_timeout_ms::bigint)
ORDER BY last_seen DESC LIMIT 1;

-- name: SeeWorkerPolicy :exec
INSERT INTO worker_policies (task_queue, capability, booking_window_ms, charge_budget_ms, charge_timeout_ms)
VALUES (@task_queue, @capability, @booking_window_ms, @charge_budget_ms, @charge_timeout_ms)
ON CONFLICT (task_queue, capability, booking_window_ms, charge_budget_ms, charge_timeout_ms) DO UPDATE SET last_seen = now();

-- name: LongestBookingWindowMS :one
-- The longest booking window any worker reported since @since (0: none).
SELECT coalesce(max(booking_window_ms), 0)::bigint FROM worker_policies WHERE last_seen >= @since;
