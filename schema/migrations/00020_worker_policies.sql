-- +goose Up
-- The charge policy of every worker that ran lately, per task queue: a worker whose money
-- settings disagree with a live worker's on its queue refuses to start, naming both, and a
-- settlement import waits out the longest booking window any worker used (docs/deployment.md).
-- Durations in milliseconds.
CREATE TABLE worker_policies (
    task_queue         text        NOT NULL,
    capability         text        NOT NULL,
    booking_window_ms  bigint      NOT NULL,
    charge_budget_ms   bigint      NOT NULL,
    charge_timeout_ms  bigint      NOT NULL,
    first_seen         timestamptz NOT NULL DEFAULT now(),
    last_seen          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_queue, capability, booking_window_ms, charge_budget_ms, charge_timeout_ms)
);

-- +goose Down
DROP TABLE worker_policies;
