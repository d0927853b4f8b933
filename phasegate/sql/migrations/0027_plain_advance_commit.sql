-- phasegate schema v27: a plain advance committed alone is a statement of its own. Re-running
-- any statement here is harmless.
--
-- With local continuation off (and for the last hop of every chain with it on), a phase that
-- advanced commits through phasegate_commit_phase: the checkpoint, the run moved on and the
-- successor's outbox row, which the worker then sends. That statement serves every kind of
-- commit, so a plain advance paid for what only the others use, as a continued hop did before
-- 0021: the CTEs of a wait and a kept signal, of a run's end (its position deleted) and of an
-- earlier release's spent row, each opened in the executor with its tables and indexes although
-- they write nothing; `status` in the run row's SET list, so the slot trigger's condition is
-- evaluated; and the successor's message parsed as JSON in the server for a chain's
-- traceparent that a plain advance never keeps (`python -m bench.statement_costs --only
-- commits`: docs/benchmarks.md).
--
-- phasegate_advance_phase is phasegate_commit_phase for exactly that case: the phase
-- advanced, the run stays `running`, its successor goes through the outbox now (no wait, no
-- chain lease). The same writes under the same condition (the run at p_seq and `running`, or
-- nothing is written and the caller gets no row):
-- - the run row moved to the next phase, with the columns commit_phase writes for a running
--   run (status not named; updated_at left to the position, 0023);
-- - the position, with no chain lease (a chain that ends here hands off through this row);
-- - the checkpoint;
-- - the successor's outbox row, due now.
-- Returns the checkpoint's time and the outbox row's id.
--
-- Only a plain advance committed by itself takes this statement; under group commit it is a
-- row of phasegate_commit_phases like any other commit (phasegate/store.py).
CREATE OR REPLACE FUNCTION phasegate_advance_phase(
    p_workflow_id text, p_branch text, p_seq integer, p_phase text, p_schema_version integer,
    p_state text, p_state_hash text, p_next_phase text, p_tier integer, p_tier_label text,
    p_resource_versions text, p_worker_id text, p_trace_id text, p_outcome text,
    p_rerun_of integer, p_error text, p_review text, p_dedup_id text, p_group_id text,
    p_body text)
RETURNS TABLE (committed_at timestamptz, outbox_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    flag text;  -- an assignment is evaluated as a simple expression; PERFORM runs a query
BEGIN
    -- The position trigger (0017) stands down: this statement writes the position itself.
    flag := set_config('phasegate.own_position', 'on', true);
    RETURN QUERY
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
               chain_holder = NULL, chain_until = NULL, chain_traceparent = NULL
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
    ), ob AS (
        INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
        SELECT workflow_id, $2, $3 + 1, $18, $19, $20 FROM run
        RETURNING outbox_id
    )
    SELECT cp.created_at, ob.outbox_id FROM cp, ob;
    flag := set_config('phasegate.own_position', 'off', true);
END $fn$;

-- The same grants as the other commits (0018, 0021, 0024): the worker role only.
REVOKE ALL ON FUNCTION phasegate_advance_phase(text, text, integer, text, integer, text, text,
    text, integer, text, text, text, text, text, integer, text, text, text, text, text)
    FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        GRANT EXECUTE ON FUNCTION phasegate_advance_phase(text, text, integer, text, integer,
            text, text, text, integer, text, text, text, text, text, integer, text, text, text,
            text, text) TO phasegate_worker;
    END IF;
END $$;
