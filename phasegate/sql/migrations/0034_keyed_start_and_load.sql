-- phasegate schema v34: a keyed workflow's start takes its slot where the run is created, and
-- a worker's keyed start is one round trip. Re-running any statement here is harmless.
--
-- Since 0033 a start message of a workflow with a concurrency key was two round trips before
-- its first phase: phasegate_start_keyed (the run created if a producer only enqueued it, then
-- its slot taken or the run queued), and, unless the run was queued, phasegate_load_for_phase
-- (the check before a phase, which claims the admitted run). A message without the input (the
-- API's start, a queued run's admission, a rate wake-up) was one more before those: the worker
-- read the run's input to compute the key, although a run admitted or queued before already
-- had it.
--
-- phasegate_start_keyed_and_load runs the two in one call: phasegate_start_keyed itself, then,
-- for any result but 'queued', phasegate_load_for_phase itself, each a statement of its own
-- that sees what the one before wrote. The worker decides on what they give, as it did on the
-- two answers: `taken` is start_keyed's result (the run's status after the decision, NULL when
-- the run does not exist), the other columns load_for_phase's row (all NULL when the run was
-- queued or the load found no run). Called without a key (p_key NULL: a message without the
-- input), it writes nothing unless the run already has its key, and then admits as
-- phasegate_take_slot does for a run that has one; a run without its key (created by an API of
-- the previous release) answers 'unkeyed', and the worker reads the input and calls again.
--
-- phasegate_start_keyed_run is start_run's statement (queries.sql) for a keyed workflow, as
-- the API sends it: the run created, its slot taken (phasegate_take_slot, with the key the API
-- computed) and, unless it was queued, its start message written to the outbox; one row, the
-- outbox row's id (NULL when queued: its admission writes the message) and the run as created,
-- in control.sql get_run's columns; no row when the id existed. So the API answers with the
-- run queued or admitted, and the worker that receives the message finds the key in the row.
--
-- Both are SECURITY INVOKER: the worker's grants and the orchestrator's (INSERT and UPDATE on
-- workflow_runs, outbox and run_admissions) are the ones their statements need.
--
-- Rolling upgrade: a worker of the previous release still calls phasegate_start_keyed and
-- loads (for a run the API keyed, phasegate_take_slot finds the key and admits, as for a
-- redelivered start); an API of the previous release writes the run without its key, which the
-- worker of this release keys as before. The functions are added before either runs.

CREATE OR REPLACE FUNCTION phasegate_start_keyed_and_load(
    p_workflow_id text, p_workflow text, p_schema_version integer, p_input jsonb,
    p_first_phase text, p_classification text, p_region text, p_key text, p_limit integer,
    p_dedup_id text, p_group_id text, p_body text, p_rate integer, p_window_s double precision,
    p_seq integer)
RETURNS TABLE (taken text, workflow_id text, workflow text, status text, next_seq integer,
               base_seq integer, current_phase text, schema_version integer, input text,
               attempts integer, epoch integer, classification text, region text, state text,
               state_hash text, state_version integer, progress text, signal text)
LANGUAGE plpgsql AS $fn$
DECLARE
    decided text;
BEGIN
    IF p_key IS NULL THEN
        PERFORM 1 FROM workflow_runs r
         WHERE r.workflow_id = p_workflow_id AND r.concurrency_key IS NOT NULL;
        IF NOT FOUND THEN
            taken := 'unkeyed';
            RETURN NEXT;
            RETURN;
        END IF;
        decided := phasegate_take_slot(p_workflow_id, p_workflow, NULL, p_limit, p_dedup_id,
                                       p_group_id, p_body, p_rate, p_window_s);
    ELSE
        decided := phasegate_start_keyed(p_workflow_id, p_workflow, p_schema_version, p_input,
                                         p_first_phase, p_classification, p_region, p_key,
                                         p_limit, p_dedup_id, p_group_id, p_body, p_rate,
                                         p_window_s);
    END IF;
    IF decided IS DISTINCT FROM 'queued' THEN
        RETURN QUERY SELECT decided, l.*
                       FROM phasegate_load_for_phase(p_workflow_id, 'main', p_seq) AS l;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- Queued (its admission writes a new start message), or no run to load.
    taken := decided;
    RETURN NEXT;
END $fn$;

CREATE OR REPLACE FUNCTION phasegate_start_keyed_run(
    p_workflow_id text, p_workflow text, p_schema_version integer, p_input jsonb,
    p_first_phase text, p_dedup_id text, p_group_id text, p_body text, p_classification text,
    p_region text, p_key text, p_limit integer, p_admit_dedup_id text, p_admit_group_id text,
    p_admit_body text, p_rate integer, p_window_s double precision)
RETURNS TABLE (outbox_id bigint, workflow_id text, workflow text, status text,
               next_seq integer, base_seq integer, epoch integer, current_phase text,
               schema_version integer, tier integer, tier_label text, attempts integer,
               error text, created_at timestamptz, updated_at timestamptz,
               finished_at timestamptz, classification text, region text,
               due_at timestamptz, waiting_for text)
LANGUAGE plpgsql AS $fn$
DECLARE
    decided text;
    written bigint;
BEGIN
    INSERT INTO workflow_runs AS r (workflow_id, workflow, schema_version, input, current_phase,
                                    classification, region)
    VALUES (p_workflow_id, p_workflow, p_schema_version, p_input, p_first_phase,
            p_classification, p_region)
    ON CONFLICT ON CONSTRAINT workflow_runs_pkey DO NOTHING;
    IF NOT FOUND THEN
        RETURN;  -- the id existed
    END IF;
    decided := phasegate_take_slot(p_workflow_id, p_workflow, p_key, p_limit, p_admit_dedup_id,
                                   p_admit_group_id, p_admit_body, p_rate, p_window_s);
    IF decided IS DISTINCT FROM 'queued' THEN
        INSERT INTO outbox AS o (workflow_id, branch, seq, dedup_id, group_id, body)
        VALUES (p_workflow_id, 'main', 0, p_dedup_id, p_group_id, p_body)
        RETURNING o.outbox_id INTO written;
    END IF;
    RETURN QUERY
    SELECT written, r.workflow_id, r.workflow, r.status, r.next_seq, r.base_seq, r.epoch,
           r.current_phase, r.schema_version, r.tier, r.tier_label, r.attempts, r.error,
           r.created_at, r.updated_at, r.finished_at, r.classification, r.region, r.due_at,
           r.waiting_for
      FROM workflow_runs r
     WHERE r.workflow_id = p_workflow_id;
END $fn$;
