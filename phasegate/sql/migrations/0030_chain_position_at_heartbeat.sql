-- phasegate schema v30: a chain's hops leave its position to the heartbeat. Re-running any
-- statement here is harmless.
--
-- A continued hop (0021, 0024) wrote three rows: the run row, the run's position with its
-- chain lease (run_positions, 0017/0020), and the checkpoint. The run row is the one every
-- commit, control action and door conditions on; the position is a copy of it for the
-- readers that scan every unfinished run (the stall report, the status summary, the relay's
-- stalled-run check) plus the chain lease. Rewriting that copy on every hop of a live chain
-- was about an eighth of the hop's server CPU as a worker sends it and a fifth of its WAL
-- (`python -m bench.statement_costs --only chains`, docs/benchmarks.md).
--
-- Now a hop writes the position only when its chain does not hold the lease, or holds it with
-- less than half a lease left: the first hop of a chain, and a hop whose heartbeat did not
-- come. Otherwise the position stays where the chain's last write left it, and:
-- - the heartbeat (phasegate_extend_chains, every PHASEGATE_HEARTBEAT_S) extends the lease
--   and brings the position up to the run row, with the time of the run's last checkpoint as
--   its updated_at: the stall readers see a live chain at most one heartbeat late;
-- - every statement that ends a chain (its last hop's commit, phasegate_end_chain, a control
--   action through the position trigger) writes the position whole, as before;
-- - what a chain is at is read from the run row, never from the position: the seq and phase
--   of a chain's message (queries `chain_of` and `expired_chains`), the seq at which
--   phasegate_end_chain may end it, and whether another writer moved the run off it (the
--   trigger compares the run row's old seq with its new one).
--
-- So between two heartbeats run_positions.next_seq may be behind workflow_runs.next_seq for a
-- run whose chain holds a live lease, and only then. Nothing gates on the position's seq.
--
-- Rolling upgrade: migrate, then deploy. A relay of the previous release reads a chain's seq
-- from its position, which this schema lets fall behind; its rescue then finds nothing to
-- end (phasegate_end_chain checks the run row) and the chain waits for a relay of this
-- release, or for its first message's redelivery to a worker of it. Grants are unchanged
-- (CREATE OR REPLACE keeps them).

-- A continued hop (0021): the run row and the checkpoint; then the position, only when the
-- lease is not this chain's or runs out within half a lease. Same signature, conditions and
-- result.
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
    flag := set_config('phasegate.own_position', 'off', true);
    RETURN committed;
END $fn$;

-- Continued hops committed together (0024): likewise, row by row.
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
    flag := set_config('phasegate.own_position', 'off', true);
END $fn$;

-- A lagging position's updated_at once brought up to its run row at p_run_seq: when the run
-- last moved on its main branch, i.e. its last phase checkpoint's time (a chain's hops leave
-- no other trace of it; now() before the first), never earlier than p_updated_at. A position
-- not behind (p_position_seq = p_run_seq) keeps p_updated_at. One probe of
-- checkpoints_phase_key.
CREATE OR REPLACE FUNCTION phasegate_caught_up_at(p_updated_at timestamptz,
                                                  p_workflow_id text, p_position_seq integer,
                                                  p_run_seq integer)
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, public, pg_temp AS $fn$
    SELECT CASE WHEN p_run_seq > p_position_seq
                THEN greatest(p_updated_at,
                              coalesce((SELECT c.created_at FROM public.checkpoints c
                                         WHERE c.workflow_id = p_workflow_id
                                           AND c.branch = 'main' AND c.seq = p_run_seq - 1
                                           AND c.kind = 'phase'), now()))
                ELSE p_updated_at END;
$fn$;
REVOKE ALL ON FUNCTION phasegate_caught_up_at(timestamptz, text, integer, integer) FROM PUBLIC;

-- The heartbeat (0020): the leases a worker holds live p_lease_s more, and each position is
-- brought up to its run row. Never backwards: a position a hop wrote after this statement's
-- snapshot is ahead of the run row this statement read, and keeps its own values.
CREATE OR REPLACE FUNCTION phasegate_extend_chains(p_workflow_ids text[], p_holder text,
                                                   p_lease_s float8)
RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
    UPDATE run_positions p
       SET chain_until = now() + make_interval(secs => p_lease_s),
           next_seq = greatest(p.next_seq, r.next_seq),
           current_phase = CASE WHEN r.next_seq > p.next_seq THEN r.current_phase
                                ELSE p.current_phase END,
           tier = CASE WHEN r.next_seq > p.next_seq THEN r.tier ELSE p.tier END,
           tier_label = CASE WHEN r.next_seq > p.next_seq THEN r.tier_label
                             ELSE p.tier_label END,
           updated_at = phasegate_caught_up_at(p.updated_at, r.workflow_id, p.next_seq,
                                               r.next_seq)
      FROM workflow_runs r
     WHERE p.workflow_id = ANY (p_workflow_ids) AND p.chain_holder = p_holder
       AND r.workflow_id = p.workflow_id
    RETURNING p.workflow_id;
$fn$;

-- A chain's message as an outbox row, its lease cleared (0020), the position brought up to
-- the run row in the same statement. The run row says where the chain is: only while the run
-- is running at p_seq. Same signature and result.
CREATE OR REPLACE FUNCTION phasegate_end_chain(
    p_workflow_id text, p_seq integer, p_holder text, p_dedup_id text, p_group_id text,
    p_body text, p_lease_holder text, p_lease_s float8)
RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
    WITH chain AS (
        UPDATE run_positions p
           SET chain_holder = NULL, chain_until = NULL, chain_traceparent = NULL,
               next_seq = r.next_seq, current_phase = r.current_phase, tier = r.tier,
               tier_label = r.tier_label,
               updated_at = phasegate_caught_up_at(p.updated_at, r.workflow_id, p.next_seq,
                                                   r.next_seq)
          FROM workflow_runs r
         WHERE p.workflow_id = p_workflow_id AND r.workflow_id = p_workflow_id
           AND r.next_seq = p_seq AND r.status = 'running'
           AND (p.chain_holder = p_holder OR (p_holder IS NULL AND p.chain_until <= now()))
        RETURNING p.workflow_id
    )
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body, lease_holder,
                        lease_until)
    SELECT workflow_id, 'main', p_seq, p_dedup_id, p_group_id, p_body, p_lease_holder,
           CASE WHEN p_lease_holder IS NOT NULL
                THEN now() + make_interval(secs => p_lease_s) END
      FROM chain
    RETURNING outbox_id;
$fn$;

-- The position trigger (0017, 0020, 0022): another writer that moves a run off the seq its
-- chain is at, or stops it running, ends the chain. Where the chain is comes from the run
-- row's old seq, since the position may be behind it. Otherwise as in 0022.
CREATE OR REPLACE FUNCTION phasegate_track_position() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND (OLD.workflow, OLD.status, OLD.next_seq, OLD.current_phase, OLD.tier,
            OLD.tier_label, OLD.updated_at)
           IS NOT DISTINCT FROM (NEW.workflow, NEW.status, NEW.next_seq, NEW.current_phase,
                                 NEW.tier, NEW.tier_label, NEW.updated_at) THEN
        RETURN NULL;  -- nothing the position holds moved (a review or an error alone)
    END IF;
    IF NEW.status IN ('completed', 'failed', 'cancelled') THEN
        IF TG_OP = 'UPDATE' THEN
            DELETE FROM public.run_positions WHERE workflow_id = NEW.workflow_id;
        END IF;
        RETURN NULL;
    END IF;
    -- The position's updated_at never goes back: a plain commit moves only the position's
    -- (0023), so a writer that leaves the run row's as it was must not undo that.
    UPDATE public.run_positions p
       SET workflow = NEW.workflow, status = NEW.status, next_seq = NEW.next_seq,
           current_phase = NEW.current_phase, tier = NEW.tier, tier_label = NEW.tier_label,
           updated_at = greatest(p.updated_at, NEW.updated_at),
           chain_holder = CASE WHEN TG_OP = 'UPDATE' AND OLD.next_seq = NEW.next_seq
                                    AND NEW.status = 'running'
                               THEN p.chain_holder END,
           chain_until = CASE WHEN TG_OP = 'UPDATE' AND OLD.next_seq = NEW.next_seq
                                   AND NEW.status = 'running'
                              THEN p.chain_until END,
           chain_traceparent = CASE WHEN TG_OP = 'UPDATE' AND OLD.next_seq = NEW.next_seq
                                         AND NEW.status = 'running'
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
