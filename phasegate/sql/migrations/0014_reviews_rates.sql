-- phasegate schema v14: review decisions delivered as signals, cancels that take a waiting
-- run's timer with them, and per-key rate limits. Re-running any statement here is harmless.

-- Review decisions (phasegate/signals.py send_decision): `phasegate approve|reject` store a
-- signal named phasegate.approve / phasegate.reject, delivered to the run's next seq under
-- the epoch the decision starts (consumed_epoch); the next phase's door reads it there
-- (queries.sql room_entry). Names starting with 'phasegate.' are reserved for these.
ALTER TABLE signals ADD COLUMN IF NOT EXISTS consumed_epoch integer;
-- One user signal per seq (ctx.signal), as before. Decisions are outside that rule: a seq
-- can be reviewed twice (an approved escalation whose staleness check stops it again).
DROP INDEX IF EXISTS signals_consumed_key;
CREATE UNIQUE INDEX IF NOT EXISTS signals_consumed_key ON signals (workflow_id, consumed_seq)
    WHERE consumed_seq IS NOT NULL AND name NOT LIKE 'phasegate.%';
CREATE INDEX IF NOT EXISTS signals_decision_idx ON signals (workflow_id, consumed_seq)
    WHERE consumed_seq IS NOT NULL AND name LIKE 'phasegate.%';

-- Per-key rate limits: `Workflow(..., concurrency_key=fn, rate=(N, seconds))`. Set at start
-- like concurrency_limit; NULL for every run without one. concurrency_limit may now be NULL
-- for a keyed run (a rate limit alone: no cap on runs at once).
ALTER TABLE workflow_runs ADD COLUMN IF NOT EXISTS rate_limit integer CHECK (rate_limit >= 1);
ALTER TABLE workflow_runs ADD COLUMN IF NOT EXISTS rate_window_s double precision
    CHECK (rate_window_s > 0);
-- The rate check: the key's admissions within the window.
CREATE INDEX IF NOT EXISTS run_admissions_recent_idx
    ON run_admissions (workflow, concurrency_key, admitted_at) WHERE admitted_at IS NOT NULL;

-- Admit queued runs of (workflow, key), oldest first, while fewer than p_limit runs hold a
-- slot (NULL: no cap) and fewer than p_rate were admitted in the last p_window_s seconds
-- (NULL: no rate). Each statement of a volatile plpgsql function reads a fresh snapshot, so
-- the counts include everything committed by whoever held the lock before.
--
-- The rate counts admissions strictly after now() - window (database time, the same now()
-- that is recorded as admitted_at): of any admissions less than a window apart, the one
-- decided last counted the others, so no window holds more than p_rate. When the rate is
-- spent, the head of the queue gets a wake-up: its start message as an outbox row due when
-- the oldest counted admission leaves the window (the timers' mechanism: the relay sends it
-- then). The worker that receives it calls phasegate_take_slot, which admits again.
CREATE OR REPLACE FUNCTION phasegate_admit(p_workflow text, p_key text, p_limit integer,
                                           p_by text, p_rate integer,
                                           p_window_s double precision) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    held integer;
    recent integer;
    oldest timestamptz;
    admitted integer := 0;
    next_run record;
BEGIN
    PERFORM pg_advisory_xact_lock(phasegate_slot_lock(p_workflow, p_key));
    LOOP
        IF p_limit IS NOT NULL THEN
            SELECT count(*) INTO held FROM workflow_runs
             WHERE workflow = p_workflow AND concurrency_key = p_key
               AND status NOT IN ('queued', 'completed', 'failed', 'cancelled');
            EXIT WHEN held >= p_limit;
        END IF;
        SELECT a.workflow_id, a.dedup_id, a.group_id, a.body INTO next_run
          FROM run_admissions a JOIN workflow_runs r USING (workflow_id)
         WHERE a.workflow = p_workflow AND a.concurrency_key = p_key
           AND a.admitted_at IS NULL AND r.status = 'queued'
         ORDER BY a.position
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        IF p_rate IS NOT NULL THEN
            SELECT count(*), min(admitted_at) INTO recent, oldest FROM run_admissions
             WHERE workflow = p_workflow AND concurrency_key = p_key
               AND admitted_at > now() - make_interval(secs => p_window_s);
            IF recent >= p_rate THEN
                -- One wake-up per (head, due time): every admit that finds the same head and
                -- the same oldest admission writes the same deduplication id.
                INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body, due_at)
                VALUES (next_run.workflow_id, 'main', 0,
                        encode(sha256(convert_to(next_run.workflow_id || chr(31) || 'rate'
                               || chr(31) || extract(epoch FROM oldest)::text, 'UTF8')), 'hex'),
                        next_run.group_id, next_run.body,
                        oldest + make_interval(secs => p_window_s))
                ON CONFLICT (dedup_id) DO NOTHING;
                EXIT;
            END IF;
        END IF;
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

-- 0011's signature, for a caller that still uses it: no rate.
CREATE OR REPLACE FUNCTION phasegate_admit(p_workflow text, p_key text, p_limit integer,
                                           p_by text) RETURNS integer
LANGUAGE sql AS $$
    SELECT phasegate_admit(p_workflow, p_key, p_limit, p_by, NULL::integer,
                           NULL::double precision)
$$;

-- A start of a workflow with a concurrency key: the run joins its key's queue and is
-- admitted at once if the key allows it. A start that finds its key already set (a
-- redelivered start, or a rate limit's wake-up) admits whoever may go now, itself included
-- while it is queued, and gets its status back. The run row is locked before the key's lock
-- (the same order as a finishing commit).
CREATE OR REPLACE FUNCTION phasegate_take_slot(p_workflow_id text, p_workflow text,
                                               p_key text, p_limit integer, p_dedup_id text,
                                               p_group_id text, p_body text, p_rate integer,
                                               p_window_s double precision) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    run record;
BEGIN
    SELECT status, concurrency_key, concurrency_limit, rate_limit, rate_window_s INTO run
      FROM workflow_runs WHERE workflow_id = p_workflow_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF run.concurrency_key IS NOT NULL THEN
        PERFORM phasegate_admit(p_workflow, run.concurrency_key, run.concurrency_limit,
                                p_workflow_id, run.rate_limit, run.rate_window_s);
        RETURN (SELECT status FROM workflow_runs WHERE workflow_id = p_workflow_id);
    END IF;
    IF run.status <> 'pending' THEN
        RETURN run.status;
    END IF;
    UPDATE workflow_runs
       SET concurrency_key = p_key, concurrency_limit = p_limit, rate_limit = p_rate,
           rate_window_s = p_window_s, status = 'queued', updated_at = now()
     WHERE workflow_id = p_workflow_id;
    INSERT INTO run_admissions (workflow_id, workflow, concurrency_key, dedup_id, group_id, body)
    VALUES (p_workflow_id, p_workflow, p_key, p_dedup_id, p_group_id, p_body);
    PERFORM phasegate_admit(p_workflow, p_key, p_limit, p_workflow_id, p_rate, p_window_s);
    RETURN (SELECT status FROM workflow_runs WHERE workflow_id = p_workflow_id);
END $$;

-- 0011's signature, for a worker of the previous release during a rolling upgrade.
CREATE OR REPLACE FUNCTION phasegate_take_slot(p_workflow_id text, p_workflow text,
                                               p_key text, p_limit integer, p_dedup_id text,
                                               p_group_id text, p_body text) RETURNS text
LANGUAGE sql AS $$
    SELECT phasegate_take_slot(p_workflow_id, p_workflow, p_key, p_limit, p_dedup_id,
                               p_group_id, p_body, NULL::integer, NULL::double precision)
$$;

-- A run that held a slot ended: admit under its key's limits (NULL limit: a rate alone).
CREATE OR REPLACE FUNCTION phasegate_free_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM phasegate_admit(OLD.workflow, OLD.concurrency_key, NEW.concurrency_limit,
                            OLD.workflow_id, NEW.rate_limit, NEW.rate_window_s);
    RETURN NULL;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_orchestrator') THEN
        -- Cancel, retry and restart delete the run's unsent timer rows (control.sql).
        GRANT DELETE ON outbox TO phasegate_orchestrator;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_reader') THEN
        GRANT SELECT (rate_limit, rate_window_s) ON workflow_runs TO phasegate_reader;
    END IF;
END $$;
