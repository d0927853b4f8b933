-- phasegate schema v36: a waiting run is claimed only once its wait is over. Re-running any
-- statement here is harmless.
--
-- phasegate_load_for_phase (0028) and its batch, phasegate_load_for_phases (0018), claimed a
-- waiting run for any message of the seq it waits on: a message that came before the wait's
-- due time ended the wait early (the next phase ran at once; a signal wait saw `ctx.signal`
-- None, as at a timeout). phasegate itself never sends such a message early: the wait's
-- outbox row goes out when it is due (the relay, or the committing worker for a wait already
-- due), and a signal that ends a wait moves the run's due_at to now() first. But anyone with
-- send rights on the queue could (a hand-written message, a replaying tool, a stranger), and
-- a timer or an approval is exactly what such a message must not skip.
--
-- A waiting run is now claimed only when its due_at has come (NULL, which no wait writes,
-- keeps the old rule). An early message reads the run as it is, still `waiting`, and the
-- worker drops it as stale; the wait's own message wakes the run when it is due, as before.
-- tests/integration/test_waits.py sends one.
--
-- Rolling upgrade: nothing to order. The functions keep their signatures and results; a
-- worker of the previous release calls the same ones.

CREATE OR REPLACE FUNCTION phasegate_load_for_phase(p_workflow_id text, p_branch text,
                                                    p_seq integer)
RETURNS TABLE (workflow_id text, workflow text, status text, next_seq integer,
               base_seq integer, current_phase text, schema_version integer, input text,
               attempts integer, epoch integer, classification text, region text, state text,
               state_hash text, state_version integer, progress text, signal text)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    -- The run as it is, when no claim is due: a read, without the claim's UPDATE of the run
    -- row and of its wait's outbox row (each opens its table's every index on every call,
    -- writing nothing).
    RETURN QUERY
    SELECT r.workflow_id, r.workflow, r.status, r.next_seq, r.base_seq, r.current_phase,
           r.schema_version, r.input::text, r.attempts, r.epoch, r.classification, r.region,
           i.state, i.state_hash, i.state_version, i.progress, i.signal
      FROM workflow_runs r
      LEFT JOIN LATERAL phasegate_phase_inputs($1, $2, r.next_seq) i ON true
     WHERE r.workflow_id = $1
       AND r.status <> 'pending'
       AND NOT (r.status = 'waiting' AND r.next_seq = $3 AND $2 = 'main'
                AND coalesce(r.due_at <= now(), true));
    IF FOUND THEN
        RETURN;
    END IF;
    -- A claim is due (or the run is gone): the claiming statement, which decides on its own
    -- snapshot, as before.
    RETURN QUERY
    WITH claimed AS (
        UPDATE workflow_runs SET status = 'running', updated_at = now(), due_at = NULL,
                                 waiting_for = NULL
        WHERE workflow_id = $1
          AND (status = 'pending'
               OR (status = 'waiting' AND next_seq = $3::int AND $2 = 'main'
                   -- 0036: only once the wait is over (its due time, or a signal's now())
                   AND coalesce(due_at <= now(), true)))
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
    SELECT run.*, i.state, i.state_hash, i.state_version, i.progress, i.signal
      FROM run
      LEFT JOIN LATERAL phasegate_phase_inputs($1, $2, run.next_seq) i ON true;
END $fn$;

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
                OR (r.status = 'waiting' AND coalesce(r.due_at <= now(), true)
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
