-- phasegate schema v31: the position trigger fires only for an update that names the run's
-- status or its updated_at; the hot commits no longer set a flag to stand it down. Re-running
-- any statement here is harmless.
--
-- workflow_runs_position_update (0017, narrowed in 0022) keeps run_positions following the run
-- row for every writer that does not write the position itself. It fired for every UPDATE of
-- workflow_runs; the commits that write the position themselves (or, for a chain that holds
-- its lease, leave it to the heartbeat: 0030) stood it down with a transaction-local setting,
-- phasegate.own_position, set on and off around their statement. On a continued hop that was
-- two set_config calls, the GUC stack unwound at commit, and the trigger's WHEN clause, which
-- PostgreSQL rebuilds from its stored text in every statement: 8-9 % of the hop's server CPU
-- as a worker sends it (`python -m bench.statement_costs --only positions`,
-- docs/benchmarks.md).
--
-- Every writer that moves a run without writing its position names status or updated_at:
-- the control plane, the doors, failures, halts, signals, waits, branches, the claim in
-- phasegate_load_for_phase(s) and the slot functions all set updated_at = now(), and they are
-- the only writers that do not own the position. The three commits that own it and name
-- neither (phasegate_continue_phase, phasegate_continue_phases, phasegate_advance_phase) now
-- pass the trigger by its column list, which PostgreSQL checks before anything else, and set
-- no flag. phasegate_commit_phase and phasegate_commit_phases name status and keep the flag.
-- tests/integration/test_position_trigger.py holds every UPDATE of workflow_runs in
-- phasegate's SQL and functions to that rule.
--
-- Rolling upgrade: nothing to order. The functions keep their signatures, results and grants
-- (CREATE OR REPLACE keeps them), and a worker of the previous release calls the same ones.

DROP TRIGGER IF EXISTS workflow_runs_position_update ON workflow_runs;
CREATE TRIGGER workflow_runs_position_update
    AFTER UPDATE OF workflow, status, updated_at ON workflow_runs
    FOR EACH ROW
    WHEN (current_setting('phasegate.own_position', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION phasegate_track_position();

-- A continued hop (0021, 0030), unchanged but for the flag.
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
    committed timestamptz;
BEGIN
    WITH run AS (
        UPDATE workflow_runs
           SET next_seq = $3 + 1, current_phase = $8, attempts = 0, error = $16,
               due_at = NULL, waiting_for = NULL, tier = $9, tier_label = $10,
               review = coalesce($17::jsonb, review), finished_at = NULL
         WHERE workflow_id = $1 AND next_seq = $3 AND status = 'running'
        RETURNING workflow_id, next_seq, current_phase, tier, tier_label
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
    -- A read, not an UPDATE that matches nothing: a hop that holds its lease (nearly all)
    -- opens run_positions for a one-row index probe only.
    IF committed IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM run_positions p
             WHERE p.workflow_id = $1 AND p.chain_holder = $18
               AND p.chain_until >= now() + make_interval(secs => $19 / 2)) THEN
        UPDATE run_positions p
           SET status = 'running', next_seq = $3 + 1, current_phase = $8, tier = $9,
               tier_label = $10, updated_at = now(), chain_holder = $18,
               chain_until = now() + make_interval(secs => $19),
               chain_traceparent = CASE WHEN p.chain_holder IS NOT DISTINCT FROM $18
                                        THEN p.chain_traceparent ELSE $20 END
         WHERE p.workflow_id = $1;
    END IF;
    RETURN committed;
END $fn$;

-- Continued hops committed together (0024, 0030), unchanged but for the flag.
CREATE OR REPLACE FUNCTION phasegate_continue_phases(
    p_workflow_ids text[], p_branch text[], p_seq integer[], p_phase text[],
    p_schema_version integer[], p_state text[], p_state_hash text[], p_next_phase text[],
    p_tier integer[], p_tier_label text[], p_resource_versions text[], p_worker_id text[],
    p_trace_id text[], p_outcome text[], p_rerun_of integer[], p_error text[], p_review text[],
    p_lease_holder text[], p_lease_s float8[], p_traceparent text[])
RETURNS TABLE (i bigint, committed_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
#variable_conflict use_column
BEGIN
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
           AND (p.chain_holder IS DISTINCT FROM b.lease_holder
                OR p.chain_until < now() + make_interval(secs => b.lease_s / 2))
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
END $fn$;

-- A plain advance (0027), unchanged but for the flag.
CREATE OR REPLACE FUNCTION phasegate_advance_phase(
    p_workflow_id text, p_branch text, p_seq integer, p_phase text, p_schema_version integer,
    p_state text, p_state_hash text, p_next_phase text, p_tier integer, p_tier_label text,
    p_resource_versions text, p_worker_id text, p_trace_id text, p_outcome text,
    p_rerun_of integer, p_error text, p_review text, p_dedup_id text, p_group_id text,
    p_body text)
RETURNS TABLE (committed_at timestamptz, outbox_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
#variable_conflict use_column
BEGIN
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
END $fn$;
