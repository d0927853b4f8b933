-- Flow control: per-key concurrency (a run waits `queued` until a slot of its
-- (workflow, key) frees) and schedules (one run per cron tick, exactly once across
-- orchestrator replicas). docs/how-to/concurrency.md, docs/how-to/schedules.md.

-- Every status of every migration, so that 0010 (`waiting`) and this one (`queued`) apply in
-- either order and the later one keeps the other's status.
ALTER TABLE workflow_runs DROP CONSTRAINT IF EXISTS workflow_runs_status_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_status_check CHECK (status IN (
    'pending', 'running', 'awaiting_review', 'completed', 'failed', 'cancelled',
    'needs_restart', 'waiting', 'queued'));

-- Set at start for workflows declared with `concurrency_key=`: the key the run counts
-- against and the limit it was started under. NULL for every other run: the slot trigger
-- below is skipped for them by its WHEN clause (no query, no lock).
ALTER TABLE workflow_runs ADD COLUMN IF NOT EXISTS concurrency_key text;
ALTER TABLE workflow_runs ADD COLUMN IF NOT EXISTS concurrency_limit integer
    CHECK (concurrency_limit >= 1);
CREATE INDEX IF NOT EXISTS workflow_runs_concurrency_idx
    ON workflow_runs (workflow, concurrency_key, status) WHERE concurrency_key IS NOT NULL;

-- One row per run that had to wait: its place in its key's queue (position: start order) and
-- the message that admits it, written when it was queued and moved to the outbox when a slot
-- frees. admitted_by: the run whose end (or start) admitted it, so that run's worker sends the
-- message at once (the relay sends it otherwise).
CREATE TABLE IF NOT EXISTS run_admissions (
    workflow_id      text PRIMARY KEY REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    workflow         text NOT NULL,
    concurrency_key  text NOT NULL,
    position         bigint GENERATED ALWAYS AS IDENTITY,
    dedup_id         text NOT NULL,
    group_id         text NOT NULL,
    body             text NOT NULL,
    queued_at        timestamptz NOT NULL DEFAULT now(),
    admitted_at      timestamptz,
    admitted_by      text
);
CREATE INDEX IF NOT EXISTS run_admissions_queue_idx
    ON run_admissions (workflow, concurrency_key, position) WHERE admitted_at IS NULL;
CREATE INDEX IF NOT EXISTS run_admissions_by_idx
    ON run_admissions (admitted_by) WHERE admitted_by IS NOT NULL;

-- Every decision about one (workflow, key) takes this transaction-scoped advisory lock
-- first, so two commits freeing slots at once, or a start and a finish, are decided one
-- after the other and each sees what the previous one committed.
CREATE OR REPLACE FUNCTION phasegate_slot_lock(p_workflow text, p_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtextextended('phasegate.concurrency' || chr(31) || p_workflow || chr(31) || p_key, 0)
$$;

-- Admit queued runs of (workflow, key), oldest first, while fewer than p_limit runs hold a
-- slot. A slot is held by every run of the key that is neither queued nor ended. Each
-- statement of a volatile plpgsql function reads a fresh snapshot, so the counts below
-- include everything committed by whoever held the lock before. Returns how many it admitted.
CREATE OR REPLACE FUNCTION phasegate_admit(p_workflow text, p_key text, p_limit integer,
                                           p_by text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    held integer;
    admitted integer := 0;
    next_run record;
BEGIN
    PERFORM pg_advisory_xact_lock(phasegate_slot_lock(p_workflow, p_key));
    LOOP
        SELECT count(*) INTO held FROM workflow_runs
         WHERE workflow = p_workflow AND concurrency_key = p_key
           AND status NOT IN ('queued', 'completed', 'failed', 'cancelled');
        EXIT WHEN held >= p_limit;
        SELECT a.workflow_id, a.dedup_id, a.group_id, a.body INTO next_run
          FROM run_admissions a JOIN workflow_runs r USING (workflow_id)
         WHERE a.workflow = p_workflow AND a.concurrency_key = p_key
           AND a.admitted_at IS NULL AND r.status = 'queued'
         ORDER BY a.position
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        -- A queued run cancelled at this moment: the UPDATE waits for the cancel, finds it
        -- no longer queued, and the next round's fresh snapshot skips it.
        UPDATE workflow_runs SET status = 'pending', updated_at = now()
         WHERE workflow_id = next_run.workflow_id AND status = 'queued';
        IF FOUND THEN
            UPDATE run_admissions SET admitted_at = now(), admitted_by = p_by
             WHERE workflow_id = next_run.workflow_id;
            -- A start admitting itself keeps the message it holds; any other run gets its own.
            IF next_run.workflow_id IS DISTINCT FROM p_by THEN
                INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
                VALUES (next_run.workflow_id, 'main', 0, next_run.dedup_id, next_run.group_id,
                        next_run.body)
                ON CONFLICT (dedup_id) DO NOTHING;
            END IF;
            admitted := admitted + 1;
        END IF;
    END LOOP;
    RETURN admitted;
END $$;

-- A start of a workflow with a concurrency key: the run (created by the start message or by
-- the API) joins its key's queue and is admitted at once if a slot is free and nobody queued
-- before it. Decided once: a redelivered start finds the key set and gets the status back.
-- The run row is locked before the key's lock (the same order as a finishing commit).
CREATE OR REPLACE FUNCTION phasegate_take_slot(p_workflow_id text, p_workflow text,
                                               p_key text, p_limit integer, p_dedup_id text,
                                               p_group_id text, p_body text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    run record;
BEGIN
    SELECT status, concurrency_key INTO run FROM workflow_runs
     WHERE workflow_id = p_workflow_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF run.concurrency_key IS NOT NULL OR run.status <> 'pending' THEN
        RETURN run.status;
    END IF;
    UPDATE workflow_runs
       SET concurrency_key = p_key, concurrency_limit = p_limit, status = 'queued',
           updated_at = now()
     WHERE workflow_id = p_workflow_id;
    INSERT INTO run_admissions (workflow_id, workflow, concurrency_key, dedup_id, group_id, body)
    VALUES (p_workflow_id, p_workflow, p_key, p_dedup_id, p_group_id, p_body);
    PERFORM phasegate_admit(p_workflow, p_key, p_limit, p_workflow_id);
    RETURN (SELECT status FROM workflow_runs WHERE workflow_id = p_workflow_id);
END $$;

-- A run that held a slot ended (completed, failed, cancelled) in whatever statement did it: a
-- phase commit, a failed attempt, a halt, an operator's cancel. The next queued run is
-- admitted in the same transaction.
CREATE OR REPLACE FUNCTION phasegate_free_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM phasegate_admit(OLD.workflow, OLD.concurrency_key,
                            coalesce(NEW.concurrency_limit, 1), OLD.workflow_id);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS workflow_runs_free_slot ON workflow_runs;
CREATE TRIGGER workflow_runs_free_slot AFTER UPDATE OF status ON workflow_runs
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL
          AND OLD.status NOT IN ('queued', 'completed', 'failed', 'cancelled')
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION phasegate_free_slot();

-- Schedules the orchestrator fires: one row per schedule name (a workflow's own schedule is
-- named after the workflow). first_seen bounds catch-up: no tick before it ever fires.
CREATE TABLE IF NOT EXISTS schedules (
    name        text PRIMARY KEY,
    workflow    text NOT NULL,
    cron        text NOT NULL,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per (schedule, tick): the primary key is what makes a tick fire once across
-- replicas. `started`: the run started for it (its start message, sent by whichever
-- orchestrator claimed it, or by any one later while sent_at is NULL); `skipped`: a missed
-- tick the catch-up policy did not fire (kept as the schedule's high-water mark).
CREATE TABLE IF NOT EXISTS schedule_ticks (
    schedule     text NOT NULL REFERENCES schedules (name) ON DELETE CASCADE,
    tick         timestamptz NOT NULL,
    action       text NOT NULL CHECK (action IN ('started', 'skipped')),
    workflow_id  text,
    dedup_id     text,
    group_id     text,
    body         text,
    claimed_at   timestamptz NOT NULL DEFAULT now(),
    sent_at      timestamptz,
    PRIMARY KEY (schedule, tick),
    CHECK ((action = 'started') = (workflow_id IS NOT NULL AND body IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS schedule_ticks_unsent_idx ON schedule_ticks (claimed_at)
    WHERE sent_at IS NULL AND action = 'started';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        GRANT SELECT, INSERT, UPDATE ON run_admissions TO phasegate_worker;
        GRANT SELECT (concurrency_key, concurrency_limit) ON workflow_runs TO phasegate_reader;
        GRANT SELECT (workflow_id, workflow, concurrency_key, position, queued_at,
                      admitted_at) ON run_admissions TO phasegate_reader;
        GRANT SELECT ON schedules, schedule_ticks TO phasegate_reader;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_orchestrator') THEN
        -- Cancel frees slots (the trigger admits); the scheduler claims and sends ticks.
        GRANT SELECT, INSERT, UPDATE ON run_admissions, schedules, schedule_ticks
            TO phasegate_orchestrator;
        GRANT DELETE ON schedule_ticks TO phasegate_orchestrator;
    END IF;
END $$;
