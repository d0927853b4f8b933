-- phasegate schema v32: a start message's run is created and loaded in one round trip.
-- Re-running any statement here is harmless.
--
-- A worker handling a start message sent two statements before its first phase: ensure_run
-- (the INSERT ... ON CONFLICT DO NOTHING that creates a run a producer only enqueued) and then
-- phasegate_load_for_phase (which claims the pending run). Each is a round trip, so a run's
-- first phase cost three with its commit, and a short run paid for it on every start: a
-- three-phase run made five round trips where four carry the same work.
--
-- phasegate_start_and_load runs the same two statements, in the same order, in one call: the
-- INSERT as ensure_run wrote it, then phasegate_load_for_phase itself, which (a statement of
-- its own inside this function) sees the row the INSERT wrote. What a caller gets back, and
-- every decision the load makes (a pending run claimed, a run already past its start left
-- alone), is what the two statements gave. Like the loads it is SECURITY INVOKER: it writes
-- and reads with the caller's grants, which ensure_run needed already (INSERT on
-- workflow_runs).
--
-- Rolling upgrade: nothing to order. A worker of the previous release still sends the two
-- statements; this release needs the function, which the migration adds before it runs.

CREATE OR REPLACE FUNCTION phasegate_start_and_load(
    p_workflow_id text, p_workflow text, p_schema_version integer, p_input jsonb,
    p_first_phase text, p_classification text, p_region text, p_seq integer)
RETURNS TABLE (workflow_id text, workflow text, status text, next_seq integer,
               base_seq integer, current_phase text, schema_version integer, input text,
               attempts integer, epoch integer, classification text, region text, state text,
               state_hash text, state_version integer, progress text, signal text)
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO workflow_runs AS r (workflow_id, workflow, schema_version, input, current_phase,
                                    classification, region)
    VALUES (p_workflow_id, p_workflow, p_schema_version, p_input, p_first_phase,
            p_classification, p_region)
    ON CONFLICT ON CONSTRAINT workflow_runs_pkey DO NOTHING;
    RETURN QUERY SELECT * FROM phasegate_load_for_phase(p_workflow_id, 'main', p_seq);
END $fn$;
