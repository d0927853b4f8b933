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
-- updated_at. Every reader of a live run's last move reads run_positions.updated_at (the
-- stall report, the status summary and the relay's stalled-run check since 0017; the API's
-- run and run list take the later of the two), so during a chain the run row's updated_at
-- stays at the chain's first hop. What that saves: PostgreSQL logs a HOT update as the bytes
-- between the first and the last column that changed, and updated_at sits after `input`, so
-- each hop logged the run's whole input again (about 1 KB a hop for a 1 KB input:
-- `python -m bench.lean_commit --input-bytes 1000 --paths continued`). With the hop's changed
-- columns all before `input`, the record stops there.
--
-- No outbox row, no wait, no signal: a commit with any of those goes through
-- phasegate_commit_phase, as does the last hop of a chain (it hands off through SQS, ends the
-- run, or fails it). Returns the checkpoint's time, NULL when the run had moved on.
--
-- Only a hop committed by itself takes this statement. Under group commit, concurrent hops
-- share one phasegate_commit_phases statement with the other commits (redefined below: a row
-- with a lease is written exactly as here, updated_at included): what this statement saves is
-- per statement, which a multi-row statement already pays once for all its rows, and a
-- statement of its own for the hops would split the batches (more statements per transition,
-- measured at 16 groups).
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

-- Group commit (0020), its leased rows (continued hops) written as phasegate_continue_phase
-- writes them: the run row's updated_at is left to the position. Same signature and result.
CREATE OR REPLACE FUNCTION phasegate_commit_phases(
    p_workflow_ids text[], p_branch text[], p_seq integer[], p_phase text[], p_schema_version integer[],
    p_state text[], p_state_hash text[], p_next_phase text[], p_status text[], p_tier integer[],
    p_tier_label text[], p_resource_versions text[], p_worker_id text[], p_trace_id text[],
    p_dedup_id text[], p_group_id text[], p_body text[], p_outcome text[], p_rerun_of integer[],
    p_error text[], p_review text[], p_wait_s float8[], p_wait_until timestamptz[],
    p_wait_signal text[], p_lease_holder text[], p_lease_s float8[], p_consumed bigint[])
RETURNS TABLE (i bigint, committed_at timestamptz, outbox_id bigint, signals_matched bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    flag text;  -- an assignment is evaluated as a simple expression; PERFORM runs a query
BEGIN
    flag := set_config('phasegate.own_position', 'on', true);
    RETURN QUERY
    WITH batch AS (
        SELECT *
          FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::integer[],
                      $6::text[], $7::text[], $8::text[], $9::text[], $10::integer[], $11::text[],
                      $12::text[], $13::text[], $14::text[], $15::text[], $16::text[], $17::text[],
                      $18::text[], $19::integer[], $20::text[], $21::text[], $22::float8[],
                      $23::timestamptz[], $24::text[], $25::text[], $26::float8[], $27::bigint[])
               WITH ORDINALITY AS b(workflow_id, branch, seq, phase, schema_version, state,
                                    state_hash, next_phase, status, tier, tier_label,
                                    resource_versions, worker_id, trace_id, dedup_id, group_id,
                                    body, outcome, rerun_of, error, review, wait_s, wait_until,
                                    wait_signal, lease_holder, lease_s, consumed, i)
         WHERE CASE WHEN wait_s IS NULL AND wait_until IS NULL AND wait_signal IS NULL THEN true
                    ELSE ('commit_phases takes no wait: ' || workflow_id)::boolean END
    ), run AS (
        UPDATE workflow_runs r
           SET next_seq = b.seq + 1, current_phase = b.next_phase, status = b.status, attempts = 0,
               due_at = NULL, waiting_for = NULL,
               error = b.error, tier = b.tier, tier_label = b.tier_label,
               review = coalesce(b.review::jsonb, r.review),
               updated_at = CASE WHEN b.lease_holder IS NULL THEN now() ELSE r.updated_at END,
               finished_at = CASE WHEN b.status = 'completed' THEN now() END
          FROM batch b
         WHERE r.workflow_id = b.workflow_id AND r.next_seq = b.seq AND r.status = 'running'
        RETURNING b.i, r.workflow_id, r.status, r.next_seq, r.current_phase, r.tier,
                  r.tier_label, r.updated_at
    ), pos AS (
        -- The run's position and its chain lease (as in phasegate_commit_phase); the
        -- position's updated_at is every hop's.
        UPDATE run_positions p
           SET status = run.status, next_seq = run.next_seq, current_phase = run.current_phase,
               tier = run.tier, tier_label = run.tier_label, updated_at = now(),
               chain_holder = b.lease_holder,
               chain_until = CASE WHEN b.lease_holder IS NOT NULL
                                  THEN now() + make_interval(secs => b.lease_s) END,
               chain_traceparent = CASE WHEN b.lease_holder IS NULL THEN NULL
                                        WHEN p.chain_holder IS NOT DISTINCT FROM b.lease_holder
                                        THEN p.chain_traceparent
                                        ELSE b.body::json ->> 'traceparent' END
          FROM run JOIN batch b ON b.i = run.i
         WHERE p.workflow_id = run.workflow_id
           AND run.status NOT IN ('completed', 'failed', 'cancelled')
    ), ended AS (
        DELETE FROM run_positions p USING run
         WHERE p.workflow_id = run.workflow_id
           AND run.status IN ('completed', 'failed', 'cancelled')
    ), won AS (
        SELECT b.* FROM batch b JOIN run ON run.i = b.i
    ), cp AS (
        INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                                 state_hash, tier, tier_label, resource_versions, worker_id, trace_id,
                                 outcome, rerun_of)
        SELECT workflow_id, branch, seq, phase, 'phase', schema_version, state::jsonb, state_hash,
               tier, tier_label, resource_versions::jsonb, worker_id, trace_id, outcome, rerun_of
          FROM won
        RETURNING workflow_id, created_at
    ), ob AS (
        INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
        SELECT workflow_id, branch, seq + 1, dedup_id, group_id, body
          FROM won WHERE dedup_id IS NOT NULL AND lease_holder IS NULL
        RETURNING workflow_id, outbox_id
    ), consumed AS (
        -- A row a worker of an earlier release leased to itself and ran locally (0018).
        DELETE FROM outbox
         WHERE outbox_id IN (SELECT consumed FROM won WHERE consumed IS NOT NULL)
           AND sent_at IS NULL
    )
    SELECT won.i, cp.created_at AS committed_at, ob.outbox_id, 0::bigint AS signals_matched
      FROM won JOIN cp ON cp.workflow_id = won.workflow_id
      LEFT JOIN ob ON ob.workflow_id = won.workflow_id;
    flag := set_config('phasegate.own_position', 'off', true);
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
