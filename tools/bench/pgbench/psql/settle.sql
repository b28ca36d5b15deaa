-- What a bulk of writes leaves for later, done now so that it does not happen during whatever is
-- measured next: autovacuum's pass with the planner statistics, then the checkpoint of their WAL.
-- CHECKPOINT needs superuser or pg_checkpoint: without it the server checkpoints in its own time.
VACUUM (ANALYZE);
\set ON_ERROR_STOP off
CHECKPOINT;
