-- phasegate schema v10: durable waits between two phases (timers and signals).
-- A phase that calls ctx.defer_next / ctx.wait_for_signal commits its successor's outbox row
-- with a due time (database time); the orchestrator's relay sends it when it is due, so no
-- worker is held during the wait. Re-running any statement here is harmless (idempotent).

-- The run statuses, including 'queued' (per-key concurrency, 0011): either migration may be
-- applied first, so both recreate the same constraint with both new statuses.
ALTER TABLE workflow_runs DROP CONSTRAINT IF EXISTS workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check CHECK (status IN (
    'pending', 'running', 'awaiting_review', 'completed', 'failed', 'cancelled',
    'needs_restart', 'waiting', 'queued'));

-- A waiting run: when its next phase becomes deliverable (the timer, or a signal's timeout)
-- and, for a signal wait, the signal's name. Both NULL when the run is not waiting.
ALTER TABLE workflow_runs ADD COLUMN IF NOT EXISTS due_at timestamptz;
ALTER TABLE workflow_runs ADD COLUMN IF NOT EXISTS waiting_for text;

-- NULL: deliverable now (every row before this migration, and every plain successor).
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS due_at timestamptz;
-- The relay's claim of due rows and the exporter's "due within the next minute".
CREATE INDEX IF NOT EXISTS outbox_due_idx ON outbox (due_at)
    WHERE sent_at IS NULL AND due_at IS NOT NULL;
-- The relay's claim of overdue plain rows, without scanning the rows of long waits.
CREATE INDEX IF NOT EXISTS outbox_unsent_plain_idx ON outbox (created_at)
    WHERE sent_at IS NULL AND due_at IS NULL;

-- Signals sent to a run. consumed_seq: the seq of the phase that receives the payload as
-- ctx.signal (NULL: kept, not delivered yet). A repeat of an idempotency key is dropped.
-- Rows go with their run (ON DELETE CASCADE: `phasegate purge`).
CREATE TABLE IF NOT EXISTS signals (
    signal_id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id      text NOT NULL REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    name             text NOT NULL,
    payload          jsonb,
    idempotency_key  text,
    consumed_seq     integer,
    actor            text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    consumed_at      timestamptz
);
CREATE UNIQUE INDEX IF NOT EXISTS signals_idempotency_key
    ON signals (workflow_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
-- The next phase's ctx.signal (load_for_phase) and the waits' matching of kept signals.
CREATE UNIQUE INDEX IF NOT EXISTS signals_consumed_key
    ON signals (workflow_id, consumed_seq) WHERE consumed_seq IS NOT NULL;
CREATE INDEX IF NOT EXISTS signals_kept_idx
    ON signals (workflow_id, name, signal_id) WHERE consumed_seq IS NULL;
-- The relay's look for signal waits a kept signal satisfies (phasegate/sql/signals.sql).
CREATE INDEX IF NOT EXISTS workflow_runs_signal_wait_idx ON workflow_runs (due_at)
    WHERE status = 'waiting' AND waiting_for IS NOT NULL;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        -- The commit matches a kept signal (UPDATE), the load reads it (SELECT).
        GRANT SELECT, UPDATE ON signals TO phasegate_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_orchestrator') THEN
        -- POST /v1/workflows/{id}/signals/{name}; the relay's matching of kept signals.
        GRANT SELECT, INSERT, UPDATE ON signals TO phasegate_orchestrator;
    END IF;
END
$$;
