-- +goose Up
-- One row per finished reconciliation (kasa reconcile or POST /admin/v1/settlements): the audit
-- trail of what each settlement file did, and the source of the reconciliation-outcome metrics
-- (the CLI is a short-lived process, so its counts must outlive it).
CREATE TABLE reconciliation_runs (
    id                   uuid        PRIMARY KEY,
    finished_at          timestamptz NOT NULL DEFAULT now(),
    source               text        NOT NULL CHECK (source IN ('cli', 'api')),
    days                 date[]      NOT NULL,
    lines                integer     NOT NULL CHECK (lines >= 0),
    matched              integer     NOT NULL CHECK (matched >= 0),
    resolved_charged     integer     NOT NULL CHECK (resolved_charged >= 0),
    resolved_not_charged integer     NOT NULL CHECK (resolved_not_charged >= 0),
    pending              integer     NOT NULL CHECK (pending >= 0),
    mismatches           integer     NOT NULL CHECK (mismatches >= 0),
    report               jsonb       NOT NULL
);
CREATE INDEX reconciliation_runs_finished ON reconciliation_runs (finished_at);

-- +goose Down
DROP TABLE reconciliation_runs;
