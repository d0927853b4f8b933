-- The console's fleet page and run timeline (docs/how-to/console.md). Re-running any
-- statement here is harmless (idempotent).
--
-- worker_presence: each worker's own row, upserted by a side task every
-- PHASEGATE_PRESENCE_INTERVAL_S and at once on every watchdog state change
-- (phasegate/worker/presence.py); the orchestrator deletes rows not seen for
-- PHASEGATE_PRESENCE_RETENTION_S. The key is an opaque id the worker process draws at start,
-- never a hostname.
CREATE TABLE IF NOT EXISTS worker_presence (
    worker_id      text PRIMARY KEY,
    started_at     timestamptz NOT NULL,
    last_seen      timestamptz NOT NULL DEFAULT now(),
    interval_s     double precision NOT NULL,
    in_flight      integer NOT NULL DEFAULT 0,
    concurrency    integer NOT NULL DEFAULT 0,
    -- ok, pressure, flushing, or off (no watchdog on that host). No CHECK: a newer worker's
    -- state is shown as it comes instead of failing its report.
    watchdog       text NOT NULL,
    flushes        bigint NOT NULL DEFAULT 0,
    last_flush_at  timestamptz,
    stopped_at     timestamptz
);
CREATE INDEX IF NOT EXISTS worker_presence_seen_idx ON worker_presence (last_seen);

-- phase_attempts: one row per failed attempt of a phase, written by the failure's own
-- statement (record_failure, branch_failure); the happy path never writes here. No unique key
-- but the id: attempt numbers start again after an operator's retry, and a conflict must
-- never make the failure itself go uncounted. Rows go with their run.
CREATE TABLE IF NOT EXISTS phase_attempts (
    attempt_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id  text NOT NULL REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    branch       text NOT NULL,
    seq          integer NOT NULL,
    phase        text,
    attempt      integer NOT NULL,
    outcome      text NOT NULL,  -- retry: it runs again after its backoff; failed: it ended the run (branch)
    error        text,
    worker_id    text,
    failed_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS phase_attempts_run_idx ON phase_attempts (workflow_id, attempt_id);

-- A wait's outbox row (0010) also keeps the signal it waited for and when the phase after it
-- started (the claim of the waiting run, load_for_phase): the timeline's waits.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS wait_signal text;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS resumed_at timestamptz;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        -- Its own presence row (a stopped worker marks it, it never deletes); the attempts.
        GRANT SELECT, INSERT, UPDATE ON worker_presence TO phasegate_worker;
        GRANT INSERT ON phase_attempts TO phasegate_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_orchestrator') THEN
        -- The fleet page and the purge of stale presence rows: the one DELETE this role has,
        -- on rows that are no history of any run.
        GRANT SELECT, DELETE ON worker_presence TO phasegate_orchestrator;
        GRANT SELECT ON phase_attempts TO phasegate_orchestrator;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_reader') THEN
        GRANT SELECT ON worker_presence TO phasegate_reader;
        -- Never the error text, as on workflow_runs.
        GRANT SELECT (attempt_id, workflow_id, branch, seq, phase, attempt, outcome,
                      worker_id, failed_at) ON phase_attempts TO phasegate_reader;
    END IF;
END
$$;
