-- phasegate schema v21: a continued hop's commit is a statement of its own. Re-running any
-- statement here is harmless.
--
-- With local continuation on (the default), most commits are continued hops: the phase
-- advanced, the run stays `running`, the worker runs the next phase itself under a chain lease
-- on the run's position (0020). phasegate_commit_phase serves every kind of commit, so each of
-- those hops paid for what only the others use: the CTEs of a wait and a kept signal, of the
-- successor's outbox row and of an earlier release's spent row, each opened in the executor
-- (the outbox and signals tables and their indexes locked and opened) even when it writes
-- nothing; `status` in the SET list, which makes PostgreSQL evaluate the slot trigger's
-- condition (0011) on every commit; and the successor's whole message, sent to be parsed as
-- JSON in the server for its traceparent. Inside the server that was 124 µs a hop against
-- 82 µs for the statement below, and 338 against 288 µs of server CPU per call with its
-- commit (`python -m bench.statement_costs`).
--
-- phasegate_continue_phase is phasegate_commit_phase for exactly that case, with the same
-- writes and conditions but one:
-- - the run row: at p_seq and `running`, or nothing happens (a stale or duplicate hop, a
--   cancel, a rescue: the caller gets NULL and its chain stops); moved to the next phase
--   with the same columns commit_phase writes for a running run (status stays `running`, so
--   it is not named, and neither trigger on status runs), except updated_at;
-- - the position and its chain lease, as commit_phase writes them with a lease (the trace
--   context is the chain's first hop's: p_traceparent, the successor's);
-- - the checkpoint.
--
-- updated_at: the position carries each phase's (0023 explains why, and does the same for
-- every commit that leaves the run running).
--
-- No outbox row, no wait, no signal: a commit with any of those goes through
-- phasegate_commit_phase, as does the last hop of a chain (it hands off through SQS, ends the
-- run, or fails it). Returns the checkpoint's time, NULL when the run had moved on.
--
-- Only a hop committed by itself takes this statement. Under group commit, concurrent hops
-- share one phasegate_commit_phases statement with the other commits (a row with a lease is
-- written as here; since 0023 updated_at included): what this statement saves is per
-- statement, which a multi-row statement already pays once for all its rows, and a statement
-- of its own for the hops would split the batches (more statements per transition, measured
-- at 16 groups).
CREATE OR REPLACE FUNCTION phasegate_continue_phase(
    p_workflow_id text, p_branch text, p_seq integer, p_phase text, p_schema_version integer,
    p_state text, p_state_hash text, p_next_phase text, p_tier integer, p_tier_label text,
    p_resource_versions text, p_worker_id text, p_trace_id text, p_outcome text,
    p_rerun_of integer, p_error text, p_review text, p_lease_holder text, p_lease_s float8,
    p_traceparent text)
RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    flag text;  -- an assignment is evaluated as a simple expression; PERFORM runs a query
    committed timestamptz;
BEGIN
    -- The position trigger (0017) stands down: this statement writes the position itself.
    flag := set_config('phasegate.own_position', 'on', true);
    WITH run AS (
        UPDATE workflow_runs
           SET next_seq = $3 + 1, current_phase = $8, attempts = 0, error = $16,
               due_at = NULL, waiting_for = NULL, tier = $9, tier_label = $10,
               review = coalesce($17::jsonb, review), finished_at = NULL
         WHERE workflow_id = $1 AND next_seq = $3 AND status = 'running'
        RETURNING workflow_id, next_seq, current_phase, tier, tier_label
    ), pos AS (
        UPDATE run_positions p
           SET status = 'running', next_seq = run.next_seq,
               current_phase = run.current_phase, tier = run.tier,
               tier_label = run.tier_label, updated_at = now(),
               chain_holder = $18,
               chain_until = now() + make_interval(secs => $19),
               chain_traceparent = CASE WHEN p.chain_holder IS NOT DISTINCT FROM $18
                                        THEN p.chain_traceparent ELSE $20 END
          FROM run
         WHERE p.workflow_id = run.workflow_id
    ), cp AS (
        INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                                 state_hash, tier, tier_label, resource_versions, worker_id,
                                 trace_id, outcome, rerun_of)
        SELECT workflow_id, $2, $3, $4, 'phase', $5, $6::jsonb, $7, $9, $10, $11::jsonb, $12,
               $13, $14, $15
          FROM run
        RETURNING created_at
    )
    SELECT created_at INTO committed FROM cp;
    flag := set_config('phasegate.own_position', 'off', true);
    RETURN committed;
END $fn$;

-- The same grants as the general commit (0018): the worker role only.
REVOKE ALL ON FUNCTION phasegate_continue_phase(text, text, integer, text, integer, text, text,
    text, integer, text, text, text, text, text, integer, text, text, text, float8, text)
    FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        GRANT EXECUTE ON FUNCTION phasegate_continue_phase(text, text, integer, text, integer,
            text, text, text, integer, text, text, text, text, text, integer, text, text, text,
            float8, text) TO phasegate_worker;
    END IF;
END $$;
