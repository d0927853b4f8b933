-- phasegate schema v23: a phase commit that leaves its run running writes the run row's
-- updated_at no more; the position (run_positions, 0017) carries each phase's. Re-running any
-- statement here is harmless.
--
-- PostgreSQL logs a HOT update as the bytes of the new row between the first and the last
-- column that changed (when the new version stays on the same page). In workflow_runs,
-- updated_at comes after `input`, the run's input as the producer sent it: so every commit,
-- which set updated_at, logged the whole input again, about 1 KB of WAL a phase for a 1 KB
-- input, a third of a continued hop's WAL (`python -m bench.lean_commit --paths continued
-- --input-bytes 1000`: 2,930 -> 1,878 bytes a hop with 0021 and this). Every column a plain
-- commit changes now comes before `input`.
--
-- Who reads a live run's last move: the stall report, the status summary and the relay's
-- stalled-run check read run_positions.updated_at (since 0017), which every commit still sets;
-- the API's run and run list (sql/control.sql) show the later of the two. The run row's
-- updated_at moves when its status does (a run ends, waits, fails) and with every other writer
-- (the control plane, a claim, a branch), as before. The commit functions keep their
-- signatures and results; phasegate_continue_phase (0021) never wrote it.

-- THE commit (0020), the run row's updated_at moving with its status only. Same signature,
-- conditions and result.
CREATE OR REPLACE FUNCTION phasegate_commit_phase(
    p_workflow_id text, p_branch text, p_seq integer, p_phase text, p_schema_version integer,
    p_state text, p_state_hash text, p_next_phase text, p_status text, p_tier integer,
    p_tier_label text, p_resource_versions text, p_worker_id text, p_trace_id text,
    p_dedup_id text, p_group_id text, p_body text, p_outcome text, p_rerun_of integer,
    p_error text, p_review text, p_wait_s float8, p_wait_until timestamptz,
    p_wait_signal text, p_lease_holder text, p_lease_s float8, p_consumed bigint)
RETURNS TABLE (committed_at timestamptz, outbox_id bigint, signals_matched bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    flag text;  -- an assignment is evaluated as a simple expression; PERFORM runs a query
BEGIN
    flag := set_config('phasegate.own_position', 'on', true);
    RETURN QUERY
    WITH kept AS (
        SELECT min(signal_id) AS signal_id FROM signals
         WHERE $24::text IS NOT NULL AND workflow_id = $1 AND name = $24 AND consumed_seq IS NULL
    ), due AS (
        SELECT CASE WHEN $9 <> 'running' OR $15::text IS NULL THEN NULL
                    WHEN (SELECT signal_id FROM kept) IS NOT NULL THEN now()
                    ELSE coalesce($23::timestamptz, now() + make_interval(secs => $22::float8))
               END AS at
    ), run AS (
        UPDATE workflow_runs
           SET next_seq = $3 + 1, current_phase = $8, attempts = 0, error = $20,
               status = CASE WHEN (SELECT at FROM due) IS NULL THEN $9 ELSE 'waiting' END,
               due_at = (SELECT at FROM due),
               waiting_for = CASE WHEN (SELECT at FROM due) IS NOT NULL THEN $24::text END,
               tier = $10, tier_label = $11, review = coalesce($21::jsonb, review),
               updated_at = CASE WHEN $9 = 'running' AND (SELECT at FROM due) IS NULL
                                 THEN updated_at ELSE now() END,
               finished_at = CASE WHEN $9 = 'completed' THEN now() END
         WHERE workflow_id = $1 AND next_seq = $3 AND status = 'running'
        RETURNING workflow_id, status, next_seq, current_phase, tier, tier_label
    ), pos AS (
        -- The run's position, written by this statement (0018), and its chain lease: $25
        -- runs the successor itself for $26 seconds (renewed by its heartbeat); no $25 ends
        -- whatever chain there was. The trace context is the chain's first hop's.
        UPDATE run_positions p
           SET status = run.status, next_seq = run.next_seq, current_phase = run.current_phase,
               tier = run.tier, tier_label = run.tier_label, updated_at = now(),
               chain_holder = $25::text,
               chain_until = CASE WHEN $25::text IS NOT NULL
                                  THEN now() + make_interval(secs => $26::float8) END,
               chain_traceparent = CASE WHEN $25::text IS NULL THEN NULL
                                        WHEN p.chain_holder IS NOT DISTINCT FROM $25::text
                                        THEN p.chain_traceparent
                                        ELSE $17::json ->> 'traceparent' END
          FROM run
         WHERE p.workflow_id = run.workflow_id
           AND run.status NOT IN ('completed', 'failed', 'cancelled')
    ), ended AS (
        DELETE FROM run_positions p USING run
         WHERE p.workflow_id = run.workflow_id
           AND run.status IN ('completed', 'failed', 'cancelled')
    ), cp AS (
        INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                                 state_hash, tier, tier_label, resource_versions, worker_id, trace_id,
                                 outcome, rerun_of)
        SELECT workflow_id, $2, $3, $4, 'phase', $5, $6::jsonb, $7, $10, $11, $12::jsonb, $13, $14,
               $18, $19
          FROM run
        RETURNING created_at
    ), sig AS (
        UPDATE signals SET consumed_seq = $3 + 1, consumed_at = now()
         WHERE signal_id = (SELECT signal_id FROM kept) AND EXISTS (SELECT 1 FROM run)
           AND (SELECT at FROM due) IS NOT NULL
        RETURNING signal_id
    ), ob AS (
        -- The successor's row, unless the chain lease above stands for it.
        -- wait_signal (0015): the signal a wait is for, kept for the timeline after the wait.
        INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body, due_at,
                            wait_signal)
        SELECT workflow_id, $2, $3 + 1, $15::text, $16, $17, (SELECT at FROM due),
               CASE WHEN (SELECT at FROM due) IS NOT NULL THEN $24::text END
          FROM run WHERE $15::text IS NOT NULL AND $25::text IS NULL
        RETURNING outbox_id, due_at
    ), consumed AS (
        -- $27: a row a worker of an earlier release leased to itself and ran locally (0018).
        DELETE FROM outbox
         WHERE outbox_id = $27::bigint AND sent_at IS NULL AND EXISTS (SELECT 1 FROM run)
    )
    SELECT (SELECT created_at FROM cp) AS committed_at,
           (SELECT outbox_id FROM ob WHERE due_at IS NULL OR due_at <= now()) AS outbox_id,
           (SELECT count(*) FROM sig) AS signals_matched;
    flag := set_config('phasegate.own_position', 'off', true);
END $fn$;

-- Group commit (0020), likewise.
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
               updated_at = CASE WHEN b.status = 'running' THEN r.updated_at ELSE now() END,
               finished_at = CASE WHEN b.status = 'completed' THEN now() END
          FROM batch b
         WHERE r.workflow_id = b.workflow_id AND r.next_seq = b.seq AND r.status = 'running'
        RETURNING b.i, r.workflow_id, r.status, r.next_seq, r.current_phase, r.tier,
                  r.tier_label
    ), pos AS (
        -- The run's position and its chain lease (as in phasegate_commit_phase).
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
