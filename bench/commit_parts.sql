-- What a continued hop's commit statement spends its time on inside the server, part by part.
--
--     createdb phasegate_parts && PHASEGATE_DATABASE_URL=postgresql://.../phasegate_parts phasegate migrate
--     psql -d phasegate_parts -At -f bench/commit_parts.sql
--
-- On a migrated, otherwise unused database (it truncates workflow_runs). 200 running runs; each
-- part is called 2,000 times, one call per transaction, as the worker commits them; the figure
-- is µs per call, commit included. synchronous_commit is off for this session so the WAL
-- flush, the same for every part, does not drown the differences (bench/statement_costs.py
-- measures the statements with their flush, as a worker sends them). The parts are the three
-- writes of phasegate_continue_phase (migration 0021) with the same SET lists and conditions:
-- the run row (with the position trigger's flag), the position with its chain lease, the
-- checkpoint; then the run row without the trigger and with two columns only, and the floor's
-- INSERT (bench/floor.py) for scale. One part is a design not built, timed for planning: the
-- hop without the run row's write (pg_temp.position_only_hop below). Two rounds; one line per
-- part: "round N, part: µs".
\set ON_ERROR_STOP 1
SET synchronous_commit = off;
SET client_min_messages = warning;
TRUNCATE workflow_runs CASCADE;
INSERT INTO workflow_runs (workflow_id, workflow, schema_version, input, current_phase, status,
                           next_seq)
SELECT 'r' || g, 'wf', 1, '{}'::jsonb, 'p0', 'running', 0 FROM generate_series(1, 200) g;
CREATE TEMP TABLE floor_rows (workflow_id text, seq int, state jsonb,
                              committed_at timestamptz DEFAULT now(),
                              PRIMARY KEY (workflow_id, seq));

-- A design not built (docs/benchmarks.md, "Not done": a commit that does not update `workflow_runs`): phasegate_continue_phase's
-- hop writing only the position and the checkpoint, the run row read for its status but not
-- written, so workflow_runs.next_seq would stay behind during a chain. Same signature, rights
-- and search_path as the real function; in pg_temp, gone with the session.
CREATE FUNCTION pg_temp.position_only_hop(
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
    WITH pos AS (
        UPDATE run_positions p
           SET next_seq = $3 + 1, current_phase = $8, tier = $9, tier_label = $10,
               updated_at = now(), chain_holder = $18,
               chain_until = now() + make_interval(secs => $19),
               chain_traceparent = CASE WHEN p.chain_holder IS NOT DISTINCT FROM $18
                                        THEN p.chain_traceparent ELSE $20 END
         WHERE p.workflow_id = $1 AND p.next_seq = $3 AND p.status = 'running'
           AND EXISTS (SELECT 1 FROM workflow_runs r
                        WHERE r.workflow_id = $1 AND r.status = 'running')
        RETURNING p.workflow_id
    ), cp AS (
        INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                                 state_hash, tier, tier_label, resource_versions, worker_id,
                                 trace_id, outcome, rerun_of)
        SELECT workflow_id, $2, $3, $4, 'phase', $5, $6::jsonb, $7, $9, $10, $11::jsonb, $12,
               $13, $14, $15
          FROM pos
        RETURNING created_at
    )
    SELECT created_at INTO committed FROM cp;
    RETURN committed;
END $fn$;

CREATE PROCEDURE pg_temp.part(round int, kind text, INOUT timed text DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz;
    state text := '{"s":"' || repeat('x', 900) || '"}';
    no_trigger boolean := kind = 'the run row, two columns, no trigger';
BEGIN
    UPDATE workflow_runs SET next_seq = 0;
    UPDATE run_positions SET next_seq = 0, chain_holder = NULL, chain_until = NULL;
    DELETE FROM checkpoints;
    DELETE FROM floor_rows;
    IF no_trigger THEN
        ALTER TABLE workflow_runs DISABLE TRIGGER workflow_runs_position_update;
    END IF;
    COMMIT;
    started := clock_timestamp();
    FOR s IN 0..9 LOOP
        FOR w IN 1..200 LOOP
            CASE kind
            WHEN 'continue_phase, the whole statement' THEN
                IF phasegate_continue_phase('r' || w, 'main', s, 'p' || s, 1, state, 'h',
                       'p' || (s + 1), NULL, NULL, NULL, 'w1', NULL, NULL, NULL, NULL, NULL,
                       'w1', 30.0, '00-abc') IS NULL THEN
                    RAISE EXCEPTION 'continue_phase of r% at seq % wrote nothing', w, s;
                END IF;
            WHEN 'a position-only hop (not built)' THEN
                IF pg_temp.position_only_hop('r' || w, 'main', s, 'p' || s, 1, state, 'h',
                       'p' || (s + 1), NULL, NULL, NULL, 'w1', NULL, NULL, NULL, NULL, NULL,
                       'w1', 30.0, '00-abc') IS NULL THEN
                    RAISE EXCEPTION 'the position-only hop of r% at seq % wrote nothing', w, s;
                END IF;
            WHEN 'the run row' THEN
                PERFORM set_config('phasegate.own_position', 'on', true);
                UPDATE workflow_runs
                   SET next_seq = s + 1, current_phase = 'p' || (s + 1), attempts = 0,
                       error = NULL, due_at = NULL, waiting_for = NULL, tier = NULL,
                       tier_label = NULL, review = coalesce(NULL::jsonb, review),
                       finished_at = NULL
                 WHERE workflow_id = 'r' || w AND next_seq = s AND status = 'running';
            WHEN 'the run row, two columns, no trigger' THEN
                UPDATE workflow_runs SET next_seq = s + 1, current_phase = 'p' || (s + 1)
                 WHERE workflow_id = 'r' || w AND next_seq = s AND status = 'running';
            WHEN 'the position and its chain lease' THEN
                UPDATE run_positions p
                   SET status = 'running', next_seq = s + 1, current_phase = 'p' || (s + 1),
                       tier = NULL, tier_label = NULL, updated_at = now(), chain_holder = 'w1',
                       chain_until = now() + make_interval(secs => 30.0),
                       chain_traceparent = CASE WHEN p.chain_holder IS NOT DISTINCT FROM 'w1'
                                                THEN p.chain_traceparent ELSE '00-abc' END
                 WHERE p.workflow_id = 'r' || w;
            WHEN 'the checkpoint' THEN
                INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version,
                                         state, state_hash, worker_id)
                VALUES ('r' || w, 'main', s, 'p' || s, 'phase', 1, state::jsonb, 'h', 'w1');
            WHEN 'the floor INSERT' THEN
                INSERT INTO floor_rows (workflow_id, seq, state)
                VALUES ('r' || w, s, state::jsonb)
                ON CONFLICT (workflow_id, seq) DO UPDATE SET state = excluded.state;
            WHEN 'an empty transaction' THEN
                NULL;
            END CASE;
            COMMIT;
        END LOOP;
    END LOOP;
    timed := format('round %s, %s: %s', round, kind,
                    round((extract(epoch FROM clock_timestamp() - started) * 1e6 / 2000)::numeric,
                          1));
    IF no_trigger THEN
        ALTER TABLE workflow_runs ENABLE TRIGGER workflow_runs_position_update;
        COMMIT;
    END IF;
END $$;

-- Every part in turn, two rounds; each line: round, part, µs per call.
SELECT format('CALL pg_temp.part(%s, %L)', round, part)
  FROM generate_series(1, 2) AS round,
       unnest(ARRAY['continue_phase, the whole statement', 'a position-only hop (not built)',
                    'the run row',
                    'the run row, two columns, no trigger', 'the position and its chain lease',
                    'the checkpoint', 'the floor INSERT', 'an empty transaction'])
       WITH ORDINALITY AS parts (part, position)
 ORDER BY round, position
\gexec
