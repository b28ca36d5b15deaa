-- name: LockWorkerPolicies :exec
-- Serialises the starting and reporting workers of a queue until the transaction ends: each then
-- sees the policy the one before it wrote, so two with different settings cannot both pass the check.
SELECT pg_advisory_xact_lock(hashtextextended('worker_policies/' || @task_queue::text, 0));

-- name: WorkerPolicyConflict :one
-- A policy other than the one given that a worker on the queue reported lately (the database
-- clock says how lately).
SELECT capability, booking_window_ms, charge_budget_ms, charge_timeout_ms, last_seen FROM worker_policies
WHERE task_queue = @task_queue AND last_seen >= now() - make_interval(secs => @live_s::float8)
  AND (capability, booking_window_ms, charge_budget_ms, charge_timeout_ms) IS DISTINCT FROM
      (@capability::text, @booking_window_ms::bigint, @charge_budget_ms::bigint, @charge_timeout_ms::bigint)
ORDER BY last_seen DESC LIMIT 1;

-- name: WorkerPolicySince :one
-- The latest policy other than the one given that a worker on the queue reported after a time:
-- the one given, or else the given policy's own last report (any time, if it never reported).
SELECT w.capability, w.booking_window_ms, w.charge_budget_ms, w.charge_timeout_ms, w.last_seen FROM worker_policies w
WHERE w.task_queue = @task_queue
  AND (w.capability, w.booking_window_ms, w.charge_budget_ms, w.charge_timeout_ms) IS DISTINCT FROM
      (@capability::text, @booking_window_ms::bigint, @charge_budget_ms::bigint, @charge_timeout_ms::bigint)
  AND w.last_seen > coalesce(sqlc.narg(after)::timestamptz, (
      SELECT max(m.last_seen) FROM worker_policies m WHERE m.task_queue = @task_queue
        AND (m.capability, m.booking_window_ms, m.charge_budget_ms, m.charge_timeout_ms) =
            (@capability::text, @booking_window_ms::bigint, @charge_budget_ms::bigint, @charge_timeout_ms::bigint)),
      '-infinity')
ORDER BY w.last_seen DESC LIMIT 1;

-- name: SeeWorkerPolicy :one
INSERT INTO worker_policies (task_queue, capability, booking_window_ms, charge_budget_ms, charge_timeout_ms)
VALUES (@task_queue, @capability, @booking_window_ms, @charge_budget_ms, @charge_timeout_ms)
ON CONFLICT (task_queue, capability, booking_window_ms, charge_budget_ms, charge_timeout_ms) DO UPDATE SET last_seen = now()
RETURNING last_seen;

-- name: LongestBookingWindowMS :one
-- The longest booking window any worker reported within the last @since_s seconds (0: none),
-- by the database's clock, which stamped the reports.
SELECT coalesce(max(booking_window_ms), 0)::bigint FROM worker_policies
WHERE last_seen >= now() - make_interval(secs => @since_s::float8);
