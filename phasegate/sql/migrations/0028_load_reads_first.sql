-- phasegate schema v28: the check before a phase reads when it has nothing to claim.
-- Re-running any statement here is harmless.
--
-- phasegate_load_for_phase was one statement for every message: a CTE that claims a pending
-- run, or a waiting run by the message it waits for (an UPDATE of workflow_runs), one that
-- stamps the claimed wait's outbox row (an UPDATE of outbox), and the reads of the state, the
-- progress and the signal. Nearly every message finds its run already running (every phase
-- but a run's first and the one after a wait), so the two UPDATEs write nothing -- yet the
-- executor prepares both on every call, opening every index of both tables.
--
-- It now first reads the run when no claim is due (not pending, not waiting for this
-- message), with its state, progress and signal, and answers from that read. Only when a
-- claim is due, or the run has no row, does the claiming statement run, on its own snapshot,
-- exactly as before: what a message gets back is what the old statement returned at the
-- read's snapshot or at the claim's. Both read what the phase starts from through one SQL
-- function, phasegate_phase_inputs, which the planner inlines.
--
-- Its batch, phasegate_load_for_phases (group load), stays as it is: the same split there
-- (a loop over the read, the claim for the messages it left) made PostgreSQL plan the read
-- anew on every call, which cost more than the UPDATEs it spared.
-- (`python -m bench.statement_costs --only loads`; docs/benchmarks.md.)

-- What a phase starts from, for the message of (workflow id, branch) about to run next_seq:
-- the state committed at the previous door, the latest progress saved for this seq, and the
-- signal delivered to it. One row, its columns NULL where there is none. A single SELECT in
-- SQL, so the planner inlines it into the statement that joins it (no call of its own).
CREATE OR REPLACE FUNCTION phasegate_phase_inputs(p_workflow_id text, p_branch text,
                                                  p_next_seq integer)
RETURNS TABLE (state text, state_hash text, state_version integer, progress text,
               signal text)
LANGUAGE sql STABLE AS $fn$
    SELECT c.state::text, c.state_hash, c.schema_version, e.state::text, s.payload::text
      FROM (VALUES (1)) AS one (x)
      -- LATERAL + LIMIT (the key is unique anyway): a plain join let the planner scan every
      -- checkpoint of the run and filter afterwards, a cost that grew with every phase.
      LEFT JOIN LATERAL (
        SELECT state, state_hash, schema_version FROM checkpoints c
         WHERE c.workflow_id = $1 AND c.branch = $2 AND c.seq = $3 - 1 AND c.kind = 'phase'
         LIMIT 1
      ) c ON true
      LEFT JOIN LATERAL (
        SELECT state FROM checkpoints e
         WHERE e.workflow_id = $1 AND e.branch = $2 AND e.seq = $3 AND e.kind = 'emergency'
         ORDER BY e.checkpoint_id DESC LIMIT 1
      ) e ON true
      LEFT JOIN LATERAL (
        -- Review decisions (phasegate.*, 0014) are the door's, never ctx.signal.
        SELECT payload FROM signals s
         WHERE s.workflow_id = $1 AND $2 = 'main' AND s.consumed_seq = $3
           AND s.name NOT LIKE 'phasegate.%'
         LIMIT 1
      ) s ON true
$fn$;

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
       AND NOT (r.status = 'waiting' AND r.next_seq = $3 AND $2 = 'main');
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
    SELECT run.*, i.state, i.state_hash, i.state_version, i.progress, i.signal
      FROM run
      LEFT JOIN LATERAL phasegate_phase_inputs($1, $2, run.next_seq) i ON true;
END $fn$;
