-- phasegate schema v33: a keyed workflow's start creates its run and takes its slot in one
-- round trip. Re-running any statement here is harmless.
--
-- A start message of a workflow with a concurrency key (0011) was two statements after the key
-- was computed: ensure_run (the INSERT ... ON CONFLICT DO NOTHING that creates a run a producer
-- only enqueued) and phasegate_take_slot (admit the run under its key's limits, or queue it).
-- phasegate_start_keyed runs the same two, in the same order, in one call: the insert, then
-- phasegate_take_slot itself, which (a statement of its own inside this function) sees the row
-- the insert wrote. Its result is take_slot's: the run's status after the decision.
--
-- Like take_slot it is SECURITY INVOKER: the worker's grants (INSERT and UPDATE on
-- workflow_runs, INSERT on run_admissions) are the ones the two statements needed.
--
-- Rolling upgrade: nothing to order. A worker of the previous release sends the two statements;
-- this release needs the function, which the migration adds before it runs.

CREATE OR REPLACE FUNCTION phasegate_start_keyed(
    p_workflow_id text, p_workflow text, p_schema_version integer, p_input jsonb,
    p_first_phase text, p_classification text, p_region text, p_key text, p_limit integer,
    p_dedup_id text, p_group_id text, p_body text, p_rate integer, p_window_s double precision)
RETURNS text
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO workflow_runs AS r (workflow_id, workflow, schema_version, input, current_phase,
                                    classification, region)
    VALUES (p_workflow_id, p_workflow, p_schema_version, p_input, p_first_phase,
            p_classification, p_region)
    ON CONFLICT ON CONSTRAINT workflow_runs_pkey DO NOTHING;
    RETURN phasegate_take_slot(p_workflow_id, p_workflow, p_key, p_limit, p_dedup_id,
                               p_group_id, p_body, p_rate, p_window_s);
END $fn$;
