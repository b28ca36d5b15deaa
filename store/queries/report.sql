-- Read-only figures the benchmark reports on kasa's tables (tools/bench).

-- name: ReportCounts :one
-- Every payment, and the rows of the tables retention empties after their windows: idempotency
-- records, outbox, inbox and webhook deliveries (what a zero retention window must leave none of).
SELECT (SELECT count(*) FROM payments)::bigint AS payments,
       ((SELECT count(*) FROM idempotency_records) + (SELECT count(*) FROM outbox)
        + (SELECT count(*) FROM inbox) + (SELECT count(*) FROM webhook_deliveries))::bigint AS windowed;
