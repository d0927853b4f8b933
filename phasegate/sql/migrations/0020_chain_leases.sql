-- phasegate schema v20: a continued hop writes no outbox row. Re-running any statement here is
-- harmless.
--
-- Local continuation (worker/continuation.py) runs phase N+1 in the worker that committed N.
-- Until now N's commit wrote N+1's message as an outbox row leased to that worker, and N+1's
-- commit deleted it again: per continued hop a heap row with the whole message, an entry in
-- each of the outbox's four indexes and a delete, about a third of the hop's WAL
-- (`python -m bench.lean_commit --paths continued`), for a row nobody reads while the chain
-- lives. The lease now lives on the run's position instead (run_positions, 0017), which the
-- commit rewrites anyway and whose only index is its primary key, so the update stays HOT:
--   chain_holder       the worker running the run locally (NULL: no chain)
--   chain_until        its lease (database time); the worker's heartbeat extends it
--   chain_traceparent  the trace context of the chain's first hop, for a rescued message
-- The message itself is rebuilt from the run when it is needed, which is rare:
-- - A chain that ends in order (a retry, a shutdown between hops) writes its row with
--   phasegate_end_chain as the holder: unleased for the worker to send now, or leased to it
--   for a retry's backoff, which the relay then honours as before.
-- - A chain whose worker died: once chain_until has passed, the relay (or a duplicate of the
--   chain's first message, worker/duplicates.py) rebuilds the message from the run
--   (phasegate/chains.py) and writes it with phasegate_end_chain as a rescuer. Either way the
--   position's lease is cleared in the same statement, under the position's row lock, so
--   exactly one of them writes the row.
-- A commit without a lease (the chain hands off through SQS, or no continuation) clears any
-- chain the position held.
--
-- Rolling upgrade: a worker of the previous release that commits with a lease gets no outbox
-- id back, so it neither continues nor sends; its run waits for the relay's rescue, one lease
-- (the visibility timeout) later. Rows such workers leased before the upgrade are still
-- honoured by the relay and by duplicates, as before.
ALTER TABLE run_positions ADD COLUMN IF NOT EXISTS chain_holder text;
ALTER TABLE run_positions ADD COLUMN IF NOT EXISTS chain_until timestamptz;
ALTER TABLE run_positions ADD COLUMN IF NOT EXISTS chain_traceparent text;

-- Any other writer that moves a run off the seq its chain is at, or stops it running (a fork's
-- commit, a halt, a pause, an operator's SQL), ends the chain: its message would wake a run
-- that is no longer where the chain left it. The chain's worker then finds nothing to end or
-- extend, and no rescuer finds it expired. (0017's trigger function, and this one clause.)
CREATE OR REPLACE FUNCTION phasegate_track_position() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF NEW.status IN ('completed', 'failed', 'cancelled') THEN
        IF TG_OP = 'UPDATE' THEN
            DELETE FROM public.run_positions WHERE workflow_id = NEW.workflow_id;
        END IF;
        RETURN NULL;
    END IF;
    UPDATE public.run_positions p
       SET workflow = NEW.workflow, status = NEW.status, next_seq = NEW.next_seq,
           current_phase = NEW.current_phase, tier = NEW.tier, tier_label = NEW.tier_label,
           updated_at = NEW.updated_at,
           chain_holder = CASE WHEN p.next_seq = NEW.next_seq AND NEW.status = 'running'
                               THEN p.chain_holder END,
           chain_until = CASE WHEN p.next_seq = NEW.next_seq AND NEW.status = 'running'
                              THEN p.chain_until END,
           chain_traceparent = CASE WHEN p.next_seq = NEW.next_seq AND NEW.status = 'running'
                                    THEN p.chain_traceparent END
     WHERE workflow_id = NEW.workflow_id;
    IF NOT FOUND THEN
        INSERT INTO public.run_positions (workflow_id, workflow, status, next_seq,
                                          current_phase, tier, tier_label, updated_at)
        VALUES (NEW.workflow_id, NEW.workflow, NEW.status, NEW.next_seq, NEW.current_phase,
                NEW.tier, NEW.tier_label, NEW.updated_at);
    END IF;
    RETURN NULL;
END $$;

-- THE commit (0018), with the chain lease on the position. Unchanged otherwise: same
-- signature (an old worker's call still works), same conditions, one statement.
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
               updated_at = now(), finished_at = CASE WHEN $9 = 'completed' THEN now() END
         WHERE workflow_id = $1 AND next_seq = $3 AND status = 'running'
        RETURNING workflow_id, status, next_seq, current_phase, tier, tier_label, updated_at
    ), pos AS (
        -- The run's position, written by this statement (0018), and its chain lease: $25
        -- runs the successor itself for $26 seconds (renewed by its heartbeat); no $25 ends
        -- whatever chain there was. The trace context is the chain's first hop's.
        UPDATE run_positions p
           SET status = run.status, next_seq = run.next_seq, current_phase = run.current_phase,
               tier = run.tier, tier_label = run.tier_label, updated_at = run.updated_at,
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

-- Group commit (0018), with the chain lease on the position as above.
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
               updated_at = now(), finished_at = CASE WHEN b.status = 'completed' THEN now() END
          FROM batch b
         WHERE r.workflow_id = b.workflow_id AND r.next_seq = b.seq AND r.status = 'running'
        RETURNING b.i, r.workflow_id, r.status, r.next_seq, r.current_phase, r.tier,
                  r.tier_label, r.updated_at
    ), pos AS (
        -- The run's position and its chain lease (as in phasegate_commit_phase).
        UPDATE run_positions p
           SET status = run.status, next_seq = run.next_seq, current_phase = run.current_phase,
               tier = run.tier, tier_label = run.tier_label, updated_at = run.updated_at,
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

-- The heartbeat of a worker's chains: their leases live p_lease_s seconds more. Only chains
-- still held by p_holder (a rescued chain stays lost); returns the runs still held.
CREATE OR REPLACE FUNCTION phasegate_extend_chains(p_workflow_ids text[], p_holder text,
                                                   p_lease_s float8)
RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
    UPDATE run_positions SET chain_until = now() + make_interval(secs => p_lease_s)
     WHERE workflow_id = ANY (p_workflow_ids) AND chain_holder = p_holder
    RETURNING workflow_id;
$fn$;

-- A chain's message written as an outbox row, its lease on the position cleared, in one
-- statement (the position's row lock orders it against a concurrent commit or rescue):
-- - p_holder set: the holder ends its own chain (a retry, a shutdown between hops);
-- - p_holder NULL: a rescuer takes a chain whose lease has run out (its worker died).
-- Only while the run is still at p_seq. The row is leased to p_lease_holder for p_lease_s
-- seconds when given (a retry's backoff; a relay's claim while it sends), else unleased for
-- the caller to send now. Returns the row's id, or NULL when there was nothing to end.
CREATE OR REPLACE FUNCTION phasegate_end_chain(
    p_workflow_id text, p_seq integer, p_holder text, p_dedup_id text, p_group_id text,
    p_body text, p_lease_holder text, p_lease_s float8)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
    WITH chain AS (
        UPDATE run_positions
           SET chain_holder = NULL, chain_until = NULL, chain_traceparent = NULL
         WHERE workflow_id = p_workflow_id AND next_seq = p_seq
           AND (chain_holder = p_holder OR (p_holder IS NULL AND chain_until <= now()))
        RETURNING workflow_id
    )
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body, lease_holder,
                        lease_until)
    SELECT workflow_id, 'main', p_seq, p_dedup_id, p_group_id, p_body, p_lease_holder,
           CASE WHEN p_lease_holder IS NOT NULL
                THEN now() + make_interval(secs => p_lease_s) END
      FROM chain
    RETURNING outbox_id;
$fn$;

-- The same grants as the commit (0018): the worker role runs its chains; the relay rescues
-- with the orchestrator role.
REVOKE ALL ON FUNCTION phasegate_extend_chains(text[], text, float8) FROM PUBLIC;
REVOKE ALL ON FUNCTION phasegate_end_chain(text, integer, text, text, text, text, text, float8)
    FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        GRANT EXECUTE ON FUNCTION phasegate_extend_chains(text[], text, float8)
            TO phasegate_worker;
        GRANT EXECUTE ON FUNCTION phasegate_end_chain(text, integer, text, text, text, text,
                                                      text, float8) TO phasegate_worker;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_orchestrator') THEN
        GRANT EXECUTE ON FUNCTION phasegate_end_chain(text, integer, text, text, text, text,
                                                      text, float8) TO phasegate_orchestrator;
    END IF;
END $$;
