-- phasegate schema v18: the hot path's statements live in the server, as PL/pgSQL functions,
-- and the outbox costs less per transition. Re-running any statement here is harmless.
--
-- Planning, once per server connection.
-- Behind a transaction-mode pooler (PgBouncer < 1.21, RDS Proxy) phasegate keeps no prepared
-- statements (phasegate/db.py), so Postgres parsed and planned the check before a phase and the
-- commit anew on every call: CTE statements over five tables with up to 27 parameters, whose
-- planning was most of a transition's Postgres CPU (`python -m bench.transitions --pooler none`
-- against the default). A PL/pgSQL function keeps the plans of its statements for the life of
-- the server connection, whoever borrows that connection from the pooler, and the statement a
-- client sends is only the call, cheap to plan. Each function's body is the statement that was
-- in sql/queries.sql ($n is the function's n-th argument; only a spent row's fate, below,
-- changed), so what a commit writes, its conditions and its atomicity (one statement) are
-- what they were; sql/queries.sql keeps the call under the same name.
--
-- The loads are SECURITY INVOKER (the default): they run with the caller's grants. The two
-- commits are SECURITY DEFINER, executable by the worker role only (end of file), with a fixed
-- search_path: they write the run's position and delete a spent outbox row, which no role may
-- do directly. `#variable_conflict use_column`: a result column named like a table column
-- (workflow_id, outbox_id) means the table's column inside the body, as it did in the
-- statement.
--
-- No row trigger on the commit. The position trigger of 0017 fired on every commit: an AFTER
-- trigger event, a PL/pgSQL call and its UPDATE, a quarter to a third of the commit's own
-- Postgres time in a loop of commits. The commit writes the position itself in its statement
-- (the pos and ended CTEs) and sets a transaction-local flag that the trigger's WHEN clause
-- reads; every other writer of a run (control plane, admissions, branches, an operator's SQL)
-- still goes through the trigger.
--
-- The outbox, two writes fewer per transition (`python -m bench.lean_commit` has the WAL by
-- record type):
-- - A continued hop's own row (local continuation: leased to the worker that ran the hop, never
--   sent) is deleted by the hop's commit instead of marked sent. Marking it sent was an update
--   that could not be HOT (sent_at is in the unsent indexes' predicates): a new row version
--   with the whole message body and an entry in each of three indexes. Nothing reads such a
--   row afterwards: a duplicate message asks for the run's latest row (next_seq), the relay
--   for unsent rows and the stalled runs' latest rows, the console's timeline for waits, and a
--   continued hop's row is none of these (it never carries a wait).
-- - outbox_unsent_idx (created_at) WHERE sent_at IS NULL goes: outbox_unsent_plain_idx and
--   outbox_due_idx (0010) cover the same rows between them, and the relay's claim, the lag
--   and the counts read those two; every outbox row paid for one more index entry.
DROP INDEX IF EXISTS outbox_unsent_idx;

-- The check before a phase: check + claim + load in one round trip (queries.sql load_for_phase).
CREATE OR REPLACE FUNCTION phasegate_load_for_phase(p_workflow_id text, p_branch text,
                                                    p_seq integer)
RETURNS TABLE (workflow_id text, workflow text, status text, next_seq integer,
               base_seq integer, current_phase text, schema_version integer, input text,
               attempts integer, epoch integer, classification text, region text, state text,
               state_hash text, state_version integer, progress text, signal text)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH claimed AS (
        UPDATE workflow_runs SET status = 'running', updated_at = now(), due_at = NULL,
                                 waiting_for = NULL
        WHERE workflow_id = $1
          AND (status = 'pending' OR (status = 'waiting' AND next_seq = $3::int AND $2 = 'main'))
        RETURNING workflow_id, workflow, status, next_seq, base_seq, current_phase,
                  schema_version, input::text AS input, attempts, epoch, classification, region
    ), resumed AS (
        -- 0015: claiming a waiting run starts the phase after its wait; the wait's row keeps when
        -- (the console's timeline). Only such a claim writes. Every other writer of an outbox row
        -- is one short statement that never waits for a run row, so this cannot deadlock and
        -- waits at most for one of them.
        UPDATE outbox o SET resumed_at = now()
          FROM claimed c
         WHERE o.workflow_id = $1 AND $2 = 'main' AND o.workflow_id = c.workflow_id
           AND o.branch = 'main' AND o.seq = c.next_seq AND o.due_at IS NOT NULL
           AND o.resumed_at IS NULL
    ), run AS (
        SELECT * FROM claimed
        UNION ALL
        SELECT workflow_id, workflow, status, next_seq, base_seq, current_phase,
               schema_version, input::text, attempts, epoch, classification, region
        FROM workflow_runs r
        WHERE r.workflow_id = $1 AND NOT EXISTS (SELECT 1 FROM claimed)
    )
    SELECT run.*,
           c.state::text AS state, c.state_hash, c.schema_version AS state_version,
           e.state::text AS progress, s.payload::text AS signal
    FROM run
    -- LATERAL + LIMIT (the key is unique anyway): a plain join let the planner scan every
    -- checkpoint of the run and filter afterwards, a cost that grew with every phase.
    LEFT JOIN LATERAL (
        SELECT state, state_hash, schema_version FROM checkpoints c
        WHERE c.workflow_id = $1 AND c.branch = $2 AND c.seq = run.next_seq - 1
          AND c.kind = 'phase'
        LIMIT 1
    ) c ON true
    LEFT JOIN LATERAL (
        SELECT state FROM checkpoints e
        WHERE e.workflow_id = $1 AND e.branch = $2
          AND e.seq = run.next_seq AND e.kind = 'emergency'
        ORDER BY e.checkpoint_id DESC LIMIT 1
    ) e ON true
    LEFT JOIN LATERAL (
        -- Review decisions (phasegate.*, 0014) are the door's, never ctx.signal.
        SELECT payload FROM signals s
        WHERE s.workflow_id = $1 AND $2 = 'main' AND s.consumed_seq = run.next_seq
          AND s.name NOT LIKE 'phasegate.%'
        LIMIT 1
    ) s ON true;
END $fn$;

-- Group load: the check for many messages in one statement (queries.sql load_for_phases).
CREATE OR REPLACE FUNCTION phasegate_load_for_phases(p_workflow_ids text[], p_branches text[],
                                                     p_seqs integer[])
RETURNS TABLE (i bigint, workflow_id text, workflow text, status text, next_seq integer,
               base_seq integer, current_phase text, schema_version integer, input text,
               attempts integer, epoch integer, classification text, region text, state text,
               state_hash text, state_version integer, progress text, signal text)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH batch AS (
        SELECT * FROM unnest($1::text[], $2::text[], $3::integer[])
                      WITH ORDINALITY AS b(workflow_id, branch, seq, i)
    ), claimed AS (
        UPDATE workflow_runs r SET status = 'running', updated_at = now(), due_at = NULL,
                                   waiting_for = NULL
         WHERE r.workflow_id IN (SELECT workflow_id FROM batch)
           AND (r.status = 'pending'
                OR (r.status = 'waiting'
                    AND EXISTS (SELECT 1 FROM batch w
                                 WHERE w.workflow_id = r.workflow_id AND w.branch = 'main'
                                   AND w.seq = r.next_seq)))
        RETURNING r.workflow_id, r.workflow, r.status, r.next_seq, r.base_seq, r.current_phase,
                  r.schema_version, r.input::text AS input, r.attempts, r.epoch, r.classification,
                  r.region
    ), resumed AS (
        -- As in load_for_phase: a claimed waiting run's wait row keeps when its next phase started.
        UPDATE outbox o SET resumed_at = now()
          FROM claimed c
         WHERE o.workflow_id = c.workflow_id AND o.branch = 'main' AND o.seq = c.next_seq
           AND o.due_at IS NOT NULL AND o.resumed_at IS NULL
    ), run AS (
        SELECT * FROM claimed
        UNION ALL
        SELECT workflow_id, workflow, status, next_seq, base_seq, current_phase,
               schema_version, input::text, attempts, epoch, classification, region
          FROM workflow_runs r
         WHERE r.workflow_id IN (SELECT workflow_id FROM batch)
           AND r.workflow_id NOT IN (SELECT workflow_id FROM claimed)
    )
    SELECT b.i, run.*,
           c.state::text AS state, c.state_hash, c.schema_version AS state_version,
           e.state::text AS progress, s.payload::text AS signal
      FROM batch b
      JOIN run ON run.workflow_id = b.workflow_id
      LEFT JOIN LATERAL (
        SELECT state, state_hash, schema_version FROM checkpoints c
         WHERE c.workflow_id = b.workflow_id AND c.branch = b.branch AND c.seq = run.next_seq - 1
           AND c.kind = 'phase'
         LIMIT 1
      ) c ON true
      LEFT JOIN LATERAL (
        SELECT state FROM checkpoints e
         WHERE e.workflow_id = b.workflow_id AND e.branch = b.branch
           AND e.seq = run.next_seq AND e.kind = 'emergency'
         ORDER BY e.checkpoint_id DESC LIMIT 1
      ) e ON true
      LEFT JOIN LATERAL (
        SELECT payload FROM signals s
         WHERE s.workflow_id = b.workflow_id AND b.branch = 'main'
           AND s.consumed_seq = run.next_seq AND s.name NOT LIKE 'phasegate.%'
         LIMIT 1
      ) s ON true;
END $fn$;

-- THE commit: checkpoint + run position + successor message (queries.sql commit_phase).
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
        -- The run's position (run_positions, 0017), written by this statement: the row
        -- trigger stands down for it (header).
        UPDATE run_positions p
           SET status = run.status, next_seq = run.next_seq, current_phase = run.current_phase,
               tier = run.tier, tier_label = run.tier_label, updated_at = run.updated_at
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
        -- $25: a worker that continues the run itself (worker/continuation.py) writes the
        -- successor leased to itself for $26 seconds; nobody sends it while the lease is live.
        -- wait_signal (0015): the signal a wait is for, kept for the timeline after the wait.
        INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body, due_at,
                            lease_holder, lease_until, wait_signal)
        SELECT workflow_id, $2, $3 + 1, $15::text, $16, $17, (SELECT at FROM due), $25::text,
               CASE WHEN $25::text IS NOT NULL THEN now() + make_interval(secs => $26::float8) END,
               CASE WHEN (SELECT at FROM due) IS NOT NULL THEN $24::text END
          FROM run WHERE $15::text IS NOT NULL
        RETURNING outbox_id, due_at
    ), consumed AS (
        -- $27: a continued hop's own row, never sent (the hop ran locally): spent by this
        -- commit, so deleted (see the header: no reader needs it).
        DELETE FROM outbox
         WHERE outbox_id = $27::bigint AND sent_at IS NULL AND EXISTS (SELECT 1 FROM run)
    )
    SELECT (SELECT created_at FROM cp) AS committed_at,
           (SELECT outbox_id FROM ob WHERE due_at IS NULL OR due_at <= now()) AS outbox_id,
           (SELECT count(*) FROM sig) AS signals_matched;
    flag := set_config('phasegate.own_position', 'off', true);
END $fn$;

-- Group commit: commit_phase for many runs in one statement (queries.sql commit_phases).
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
        -- The run's position (run_positions, 0017), written by this statement: the row
        -- trigger stands down for it (header).
        UPDATE run_positions p
           SET status = run.status, next_seq = run.next_seq, current_phase = run.current_phase,
               tier = run.tier, tier_label = run.tier_label, updated_at = run.updated_at
          FROM run
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
        INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body, lease_holder,
                            lease_until)
        SELECT workflow_id, branch, seq + 1, dedup_id, group_id, body, lease_holder,
               CASE WHEN lease_holder IS NOT NULL THEN now() + make_interval(secs => lease_s) END
          FROM won WHERE dedup_id IS NOT NULL
        RETURNING workflow_id, outbox_id
    ), consumed AS (
        -- A continued hop's own row, never sent (the hop ran locally): spent by its commit.
        DELETE FROM outbox
         WHERE outbox_id IN (SELECT consumed FROM won WHERE consumed IS NOT NULL)
           AND sent_at IS NULL
    )
    SELECT won.i, cp.created_at AS committed_at, ob.outbox_id, 0::bigint AS signals_matched
      FROM won JOIN cp ON cp.workflow_id = won.workflow_id
      LEFT JOIN ob ON ob.workflow_id = won.workflow_id;
    flag := set_config('phasegate.own_position', 'off', true);
END $fn$;

-- The position trigger (0017) stands down for the commit's own statement, which writes the
-- position itself (above); every other writer of a run keeps it in step as before. The flag
-- is transaction-local and the commit functions turn it off again before they return, so it
-- never reaches another statement (and a pooler hands no state to the next client).
DROP TRIGGER IF EXISTS workflow_runs_position_update ON workflow_runs;
CREATE TRIGGER workflow_runs_position_update AFTER UPDATE ON workflow_runs
    FOR EACH ROW
    WHEN ((OLD.workflow, OLD.status, OLD.next_seq, OLD.current_phase, OLD.tier,
           OLD.tier_label, OLD.updated_at)
          IS DISTINCT FROM (NEW.workflow, NEW.status, NEW.next_seq, NEW.current_phase,
                            NEW.tier, NEW.tier_label, NEW.updated_at)
          AND current_setting('phasegate.own_position', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION phasegate_track_position();

-- The commit functions run with their owner's rights (SECURITY DEFINER: the position, and a
-- spent outbox row's delete, which the worker role cannot do itself), so only the roles that
-- commit phases may call them.
REVOKE ALL ON FUNCTION phasegate_commit_phase(text, text, integer, text, integer, text, text,
    text, text, integer, text, text, text, text, text, text, text, text, integer, text, text,
    float8, timestamptz, text, text, float8, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION phasegate_commit_phases(text[], text[], integer[], text[], integer[],
    text[], text[], text[], text[], integer[], text[], text[], text[], text[], text[], text[],
    text[], text[], integer[], text[], text[], float8[], timestamptz[], text[], text[],
    float8[], bigint[]) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        GRANT EXECUTE ON FUNCTION phasegate_commit_phase(text, text, integer, text, integer,
            text, text, text, text, integer, text, text, text, text, text, text, text, text,
            integer, text, text, float8, timestamptz, text, text, float8, bigint)
            TO phasegate_worker;
        GRANT EXECUTE ON FUNCTION phasegate_commit_phases(text[], text[], integer[], text[],
            integer[], text[], text[], text[], text[], integer[], text[], text[], text[],
            text[], text[], text[], text[], text[], integer[], text[], text[], float8[],
            timestamptz[], text[], text[], float8[], bigint[]) TO phasegate_worker;
    END IF;
END $$;
