-- phasegate schema v34: a keyed workflow's start creates its run, takes its slot and, once
-- admitted, loads it, in one round trip. Re-running any statement here is harmless.
--
-- Since 0033 a start message of a workflow with a concurrency key was two round trips before
-- its first phase: phasegate_start_keyed (the run created if a producer only enqueued it, then
-- its slot taken or the run queued), and, unless the run was queued, phasegate_load_for_phase
-- (the check before a phase, which claims the admitted run). phasegate_start_keyed_and_load
-- runs the same statements, in the same order, in one call: phasegate_start_keyed itself, then,
-- for any result but 'queued', phasegate_load_for_phase itself, each a statement of its own
-- that sees what the one before wrote. The worker decides on what they give, as it did on the
-- two answers: `taken` is start_keyed's result (the run's status after the decision, NULL
-- when the run does not exist), the other columns load_for_phase's row (all NULL when the run
-- was queued or the load found no run).
--
-- Like both it is SECURITY INVOKER: the worker's grants are the ones the two calls needed.
--
-- Rolling upgrade: nothing to order. A worker of the previous release still calls
-- phasegate_start_keyed and then loads; this release needs the function, which the migration
-- adds before it runs.

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
    decided := phasegate_start_keyed(p_workflow_id, p_workflow, p_schema_version, p_input,
                                     p_first_phase, p_classification, p_region, p_key, p_limit,
                                     p_dedup_id, p_group_id, p_body, p_rate, p_window_s);
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
