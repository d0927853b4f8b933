-- phasegate schema v24: continued hops committed together take a statement of their own.
-- Re-running any statement here is harmless.
--
-- Under group commit (0009), concurrent commits of a worker share one phasegate_commit_phases
-- statement. With local continuation on, nearly all of them are continued hops (the run stays
-- `running`, the worker runs the successor itself under a chain lease on the run's position,
-- 0020), and commit_phases made each batch of them pay for what only other commits use, as
-- commit_phase did for a hop sent alone before 0021: the CTEs of the outbox row, of a run's
-- end (its position deleted) and of an earlier release's spent row, each opened in the
-- executor with its tables and indexes although they write nothing; `status` in the run
-- row's SET list, so the slot trigger's condition (0011) is evaluated for every row; and the
-- successor's message, parsed as JSON in the server for its traceparent.
--
-- phasegate_continue_phases is phasegate_continue_phase (0021) for many runs in ONE
-- statement, as commit_phases is commit_phase's: $1-$20 are arrays of continue_phase's
-- arguments, one element per hop. Each row's condition is checked on its own (the run at
-- that seq and `running`, or the row writes nothing and its caller's chain stops); two hops
-- of one run and seq in a batch (a duplicate) update the run once, and only the hop whose
-- ordinal the UPDATE returns writes its checkpoint. The writes are continue_phase's, row by
-- row: the run row moved to the next phase (status and updated_at untouched, 0023), its
-- position and chain lease, the checkpoint. Returns one row per hop that committed: its
-- ordinal (1-based) and the checkpoint's time.
--
-- The worker sends it when every commit of a batch is a continued hop
-- (phasegate/group_commit.py: the calls' own forms, batched); a batch with any other commit
-- goes through commit_phases as before.
CREATE OR REPLACE FUNCTION phasegate_continue_phases(
    p_workflow_ids text[], p_branch text[], p_seq integer[], p_phase text[],
    p_schema_version integer[], p_state text[], p_state_hash text[], p_next_phase text[],
    p_tier integer[], p_tier_label text[], p_resource_versions text[], p_worker_id text[],
    p_trace_id text[], p_outcome text[], p_rerun_of integer[], p_error text[], p_review text[],
    p_lease_holder text[], p_lease_s float8[], p_traceparent text[])
RETURNS TABLE (i bigint, committed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    flag text;  -- an assignment is evaluated as a simple expression; PERFORM runs a query
BEGIN
    -- The position trigger (0017) stands down: this statement writes the positions itself.
    flag := set_config('phasegate.own_position', 'on', true);
    RETURN QUERY
    WITH batch AS (
        SELECT *
          FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::integer[],
                      $6::text[], $7::text[], $8::text[], $9::integer[], $10::text[],
                      $11::text[], $12::text[], $13::text[], $14::text[], $15::integer[],
                      $16::text[], $17::text[], $18::text[], $19::float8[], $20::text[])
               WITH ORDINALITY AS b(workflow_id, branch, seq, phase, schema_version, state,
                                    state_hash, next_phase, tier, tier_label,
                                    resource_versions, worker_id, trace_id, outcome, rerun_of,
                                    error, review, lease_holder, lease_s, traceparent, i)
    ), run AS (
        UPDATE workflow_runs r
           SET next_seq = b.seq + 1, current_phase = b.next_phase, attempts = 0,
               error = b.error, due_at = NULL, waiting_for = NULL, tier = b.tier,
               tier_label = b.tier_label, review = coalesce(b.review::jsonb, r.review),
               finished_at = NULL
          FROM batch b
         WHERE r.workflow_id = b.workflow_id AND r.next_seq = b.seq AND r.status = 'running'
        RETURNING b.i, r.workflow_id, r.next_seq, r.current_phase, r.tier, r.tier_label
    ), pos AS (
        UPDATE run_positions p
           SET status = 'running', next_seq = run.next_seq,
               current_phase = run.current_phase, tier = run.tier,
               tier_label = run.tier_label, updated_at = now(),
               chain_holder = b.lease_holder,
               chain_until = now() + make_interval(secs => b.lease_s),
               chain_traceparent = CASE WHEN p.chain_holder IS NOT DISTINCT FROM b.lease_holder
                                        THEN p.chain_traceparent ELSE b.traceparent END
          FROM run JOIN batch b ON b.i = run.i
         WHERE p.workflow_id = run.workflow_id
    ), won AS (
        SELECT b.* FROM batch b JOIN run ON run.i = b.i
    ), cp AS (
        INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                                 state_hash, tier, tier_label, resource_versions, worker_id,
                                 trace_id, outcome, rerun_of)
        SELECT workflow_id, branch, seq, phase, 'phase', schema_version, state::jsonb,
               state_hash, tier, tier_label, resource_versions::jsonb, worker_id, trace_id,
               outcome, rerun_of
          FROM won
        RETURNING workflow_id, created_at
    )
    SELECT won.i, cp.created_at AS committed_at
      FROM won JOIN cp ON cp.workflow_id = won.workflow_id;
    flag := set_config('phasegate.own_position', 'off', true);
END $fn$;

-- The same grants as the other commits (0018, 0021): the worker role only.
REVOKE ALL ON FUNCTION phasegate_continue_phases(text[], text[], integer[], text[], integer[],
    text[], text[], text[], integer[], text[], text[], text[], text[], text[], integer[],
    text[], text[], text[], float8[], text[]) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        GRANT EXECUTE ON FUNCTION phasegate_continue_phases(text[], text[], integer[], text[],
            integer[], text[], text[], text[], integer[], text[], text[], text[], text[],
            text[], integer[], text[], text[], text[], float8[], text[]) TO phasegate_worker;
    END IF;
END $$;
