-- Branches: fork, branch phases, fan-in, race, supervisor merge (phasegate/branches.py,
-- orchestrator/branching.py; schema 0004_branches). Named queries, loaded like queries.sql.
--
-- Locking order, everywhere: the fork row first, then branch rows, then the run row. A
-- branch's non-final commit is one statement that locks only its own branch row, so it can
-- never hold a lock another commit waits for while waiting itself.

-- name: fork_commit
-- A phase on the main chain called ctx.fork: its checkpoint, the run moved to the merge phase
-- (no main message: the merge message is written by the fan-in), the fork, one row per branch
-- and one outbox start message per branch (each in its own group) -- ONE statement,
-- conditional on the run still being at this seq, so a crash never forks twice or half.
WITH run AS (
    UPDATE workflow_runs
       SET next_seq = $2 + 1, current_phase = $7, attempts = 0, error = NULL,
           tier = $8, tier_label = $9, updated_at = now()
     WHERE workflow_id = $1 AND next_seq = $2 AND status = 'running'
    RETURNING workflow_id
), cp AS (
    INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                             state_hash, tier, tier_label, resource_versions, worker_id, trace_id)
    SELECT workflow_id, 'main', $2, $3, 'phase', $4, $5::jsonb, $6, $8, $9, $10::jsonb, $11, $12
      FROM run
    RETURNING created_at
), fk AS (
    INSERT INTO forks (workflow_id, parent_branch, fork_seq, mode, merge_phase, after_merge,
                       win_tier, branch_count, pending)
    SELECT workflow_id, 'main', $2, $13, $7, $14, $15, cardinality($16::text[]),
           cardinality($16::text[])
      FROM run
    RETURNING workflow_id
), br AS (
    INSERT INTO branches (workflow_id, branch, parent_branch, fork_seq, ordinal, next_seq,
                          current_phase, input)
    SELECT fk.workflow_id, b.name, 'main', $2, (b.ord - 1)::int, $2 + 1, $18, b.input::jsonb
      FROM fk, unnest($16::text[], $17::text[]) WITH ORDINALITY AS b(name, input, ord)
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT run.workflow_id, m.branch, $2 + 1, m.dedup, m.grp, m.body
      FROM run, unnest($16::text[], $19::text[], $20::text[], $21::text[])
                AS m(branch, dedup, grp, body)
    RETURNING outbox_id, dedup_id
)
SELECT cp.created_at AS committed_at, ob.outbox_id, ob.dedup_id
  FROM cp LEFT JOIN ob ON true;

-- name: load_branch
-- load_for_phase for a branch: the branch's position (status is the run's when the run is not
-- running), its fork, the state committed at its previous door and in-phase progress.
SELECT b.workflow_id, r.workflow,
       CASE WHEN r.status <> 'running' THEN r.status ELSE b.status END AS status,
       b.next_seq, b.fork_seq + 1 AS base_seq, b.current_phase, r.schema_version,
       b.input::text AS input, b.attempts, r.epoch,
       c.state::text AS state, c.state_hash, c.schema_version AS state_version,
       e.state::text AS progress,
       b.fork_seq, b.parent_branch, f.mode, f.merge_phase, f.win_tier
  FROM branches b
  JOIN workflow_runs r ON r.workflow_id = b.workflow_id
  JOIN forks f ON f.workflow_id = b.workflow_id AND f.parent_branch = b.parent_branch
              AND f.fork_seq = b.fork_seq
  LEFT JOIN checkpoints c
         ON c.workflow_id = b.workflow_id AND c.branch = b.branch
        AND c.seq = b.next_seq - 1 AND c.kind = 'phase'
  LEFT JOIN LATERAL (
      SELECT state FROM checkpoints e
       WHERE e.workflow_id = b.workflow_id AND e.branch = b.branch
         AND e.seq = b.next_seq AND e.kind = 'emergency'
       ORDER BY e.checkpoint_id DESC LIMIT 1
  ) e ON true
 WHERE b.workflow_id = $1 AND b.branch = $2;

-- name: branch_commit
-- commit_phase for a branch: checkpoint + branch position + the branch's next message, one
-- statement, conditional on the branch still being at this seq and running and on the run
-- still running. $9 final: the branch is done (its next phase is the merge phase, or it
-- reached its race's win tier); its final state is this checkpoint.
WITH br AS (
    UPDATE branches
       SET next_seq = $3 + 1, current_phase = coalesce($8, current_phase), attempts = 0,
           error = NULL, tier = $10, tier_label = $11, updated_at = now(),
           status = CASE WHEN $9 THEN 'completed' ELSE 'running' END,
           final_seq = CASE WHEN $9 THEN $3 END,
           finished_at = CASE WHEN $9 THEN now() END
     WHERE workflow_id = $1 AND branch = $2 AND next_seq = $3 AND status = 'running'
       AND EXISTS (SELECT 1 FROM workflow_runs r
                    WHERE r.workflow_id = $1 AND r.status = 'running')
    RETURNING workflow_id
), cp AS (
    INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                             state_hash, tier, tier_label, resource_versions, worker_id, trace_id)
    SELECT workflow_id, $2, $3, $4, 'phase', $5, $6::jsonb, $7, $10, $11, $12::jsonb, $13, $14
      FROM br
    RETURNING created_at
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT workflow_id, $2, $3 + 1, $15::text, $16, $17 FROM br WHERE $15::text IS NOT NULL
    RETURNING outbox_id
)
SELECT (SELECT created_at FROM cp) AS committed_at, (SELECT outbox_id FROM ob) AS outbox_id;

-- name: fork_lock
-- The first statement of every transaction that may resolve a fork. Commits that could both
-- be "last" queue here; the second sees the first's decrement once the first has committed.
SELECT status, mode, pending, merge_phase, after_merge
  FROM forks
 WHERE workflow_id = $1 AND parent_branch = 'main' AND fork_seq = $2
   FOR UPDATE;

-- name: fork_settle
-- After a branch's final commit, in the same transaction, under the fork lock: count it, and
-- when $3 (resolution) is set, resolve the fork -- branches merged (race: the winner $4
-- merged, the others discarded), the run touched and the merge message in the outbox.
WITH fk AS (
    UPDATE forks
       SET pending = pending - 1,
           status = CASE WHEN $3::text IS NOT NULL THEN 'merged' ELSE status END,
           resolution = $3, winner = $4::text,
           resolved_at = CASE WHEN $3::text IS NOT NULL THEN now() END
     WHERE workflow_id = $1 AND parent_branch = 'main' AND fork_seq = $2 AND status = 'open'
    RETURNING workflow_id
), settled AS (
    UPDATE branches
       SET status = CASE WHEN $4::text IS NULL OR branch = $4::text THEN 'merged'
                         ELSE 'discarded' END,
           updated_at = now(), finished_at = coalesce(finished_at, now())
     WHERE workflow_id = $1 AND parent_branch = 'main' AND fork_seq = $2
       AND $3::text IS NOT NULL AND status IN ('running', 'completed')
       AND EXISTS (SELECT 1 FROM fk)
), run AS (
    UPDATE workflow_runs SET updated_at = now()
     WHERE workflow_id = $1 AND next_seq = $2 + 1 AND status = 'running'
       AND $3::text IS NOT NULL AND EXISTS (SELECT 1 FROM fk)
    RETURNING workflow_id
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT workflow_id, 'main', $2 + 1, $5, $6, $7 FROM run
    RETURNING outbox_id
)
SELECT EXISTS (SELECT 1 FROM fk) AS settled, (SELECT outbox_id FROM ob) AS outbox_id;

-- name: branch_discarded
-- A branch phase whose commit failed because its branch was discarded: record what it
-- produced as a 'discarded' checkpoint (never part of a chain, never merged).
INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                         state_hash, tier, tier_label, worker_id, trace_id)
SELECT b.workflow_id, b.branch, $3, $4, 'discarded', $5, $6::jsonb, $7, $8, $9, $10, $11
  FROM branches b
 WHERE b.workflow_id = $1 AND b.branch = $2 AND b.status = 'discarded' AND b.next_seq = $3
   AND NOT EXISTS (SELECT 1 FROM checkpoints c
                    WHERE c.workflow_id = $1 AND c.branch = $2 AND c.seq = $3
                      AND c.kind = 'discarded')
RETURNING checkpoint_id;

-- name: branch_failure
-- A branch phase raised: count the attempt on the branch; at the limit the branch is failed
-- and so is the run (with the branch named in its error).
WITH br AS (
    UPDATE branches
       SET attempts = attempts + 1, error = $3, updated_at = now(),
           status = CASE WHEN attempts + 1 >= $5 THEN 'failed' ELSE status END,
           finished_at = CASE WHEN attempts + 1 >= $5 THEN now() ELSE finished_at END
     WHERE workflow_id = $1 AND branch = $2 AND next_seq = $4 AND status = 'running'
       AND EXISTS (SELECT 1 FROM workflow_runs r
                    WHERE r.workflow_id = $1 AND r.status = 'running')
    RETURNING attempts, status
), run AS (
    UPDATE workflow_runs
       SET status = 'failed', error = 'branch ' || $2 || ': ' || $3, updated_at = now(),
           finished_at = now()
     WHERE workflow_id = $1 AND status = 'running'
       AND EXISTS (SELECT 1 FROM br WHERE br.status = 'failed')
)
SELECT attempts, status FROM br;

-- name: branch_halt
-- A branch that cannot go on (its checkpoint is corrupt or cannot be upcast): the branch is
-- failed and the run stops with the reason.
WITH br AS (
    UPDATE branches SET status = 'failed', error = $4, updated_at = now(), finished_at = now()
     WHERE workflow_id = $1 AND branch = $2 AND next_seq = $3 AND status = 'running'
    RETURNING workflow_id
)
UPDATE workflow_runs
   SET status = $5, error = 'branch ' || $2 || ': ' || $4, updated_at = now(),
       finished_at = CASE WHEN $5 IN ('failed', 'cancelled') THEN now() END
 WHERE workflow_id = $1 AND status = 'running' AND EXISTS (SELECT 1 FROM br)
RETURNING workflow_id;

-- name: merge_input
-- What a merge phase at main seq $2 receives: the newest fork of this life of the run ($4:
-- base_seq) that merges into phase $3, and the final state of each of its merged branches in
-- fork order. fork_status 'open': the fan-in has not happened (the message is premature).
WITH f AS (
    SELECT fork_seq, status, resolution
      FROM forks
     WHERE workflow_id = $1 AND parent_branch = 'main' AND fork_seq < $2
       AND fork_seq >= $4 AND merge_phase = $3
     ORDER BY fork_seq DESC
     LIMIT 1
)
SELECT f.fork_seq, f.status AS fork_status, f.resolution, b.branch, b.final_seq,
       b.tier, b.tier_label, c.state::text AS state, c.state_hash,
       c.schema_version AS state_version
  FROM f
  LEFT JOIN branches b
         ON b.workflow_id = $1 AND b.parent_branch = 'main' AND b.fork_seq = f.fork_seq
        AND b.status = 'merged'
  LEFT JOIN checkpoints c
         ON c.workflow_id = $1 AND c.branch = b.branch AND c.seq = b.final_seq
        AND c.kind = 'phase'
 ORDER BY b.ordinal;

-- name: open_fork_lock
-- Supervisor merge: the run's open fork (the newest), locked like a branch's final commit.
SELECT f.fork_seq, f.merge_phase, f.after_merge, r.workflow, r.status AS run_status,
       r.next_seq, r.epoch
  FROM forks f
  JOIN workflow_runs r ON r.workflow_id = f.workflow_id
 WHERE f.workflow_id = $1 AND f.parent_branch = 'main' AND f.status = 'open'
 ORDER BY f.fork_seq DESC
 LIMIT 1
   FOR UPDATE OF f;

-- name: supervisor_merge
-- Promote branch $2's latest committed state to the main chain at the merge seq ($3 =
-- fork_seq): a main checkpoint recording its source branch, the run moved past the merge
-- phase (completed if it was the last), the fork resolved ('supervisor', winner $2), the
-- branch merged and its siblings discarded, the action logged and the next main message in
-- the outbox -- one statement, under the fork lock, conditional on the run as read.
WITH src AS (
    SELECT c.seq, c.state, c.state_hash, c.schema_version, c.tier, c.tier_label
      FROM branches b
      JOIN checkpoints c ON c.workflow_id = b.workflow_id AND c.branch = b.branch
                        AND c.kind = 'phase'
     WHERE b.workflow_id = $1 AND b.branch = $2 AND b.parent_branch = 'main'
       AND b.fork_seq = $3 AND b.status IN ('running', 'completed', 'failed')
     ORDER BY c.seq DESC
     LIMIT 1
), run AS (
    UPDATE workflow_runs
       SET next_seq = $3 + 2, current_phase = coalesce($5, $4),
           status = CASE WHEN $5::text IS NULL THEN 'completed' ELSE 'running' END,
           attempts = 0, error = NULL, updated_at = now(),
           finished_at = CASE WHEN $5::text IS NULL THEN now() END
     WHERE workflow_id = $1 AND next_seq = $3 + 1 AND status = $6
       AND EXISTS (SELECT 1 FROM src)
    RETURNING workflow_id, next_seq, epoch
), cp AS (
    INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                             state_hash, tier, tier_label, worker_id, source_branch)
    SELECT run.workflow_id, 'main', $3 + 1, $4, 'phase', src.schema_version, src.state,
           src.state_hash, src.tier, src.tier_label, 'supervisor', $2
      FROM run, src
    RETURNING created_at
), fk AS (
    UPDATE forks
       SET status = 'merged', resolution = 'supervisor', winner = $2, resolved_at = now()
     WHERE workflow_id = $1 AND parent_branch = 'main' AND fork_seq = $3
       AND EXISTS (SELECT 1 FROM run)
), br AS (
    UPDATE branches b
       SET status = CASE WHEN b.branch = $2 THEN 'merged' ELSE 'discarded' END,
           final_seq = CASE WHEN b.branch = $2 THEN (SELECT seq FROM src) ELSE b.final_seq END,
           updated_at = now(), finished_at = coalesce(b.finished_at, now())
     WHERE b.workflow_id = $1 AND b.parent_branch = 'main' AND b.fork_seq = $3
       AND b.status IN ('running', 'completed', 'failed') AND EXISTS (SELECT 1 FROM run)
), act AS (
    INSERT INTO control_actions (workflow_id, action, from_status, seq, epoch, reason, actor)
    SELECT workflow_id, 'merge', $6, $3 + 1, epoch, $7, $8 FROM run
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT workflow_id, 'main', next_seq, $9, $10, $11 FROM run WHERE $9::text IS NOT NULL
    RETURNING outbox_id
)
SELECT (SELECT created_at FROM cp) AS committed_at, (SELECT outbox_id FROM ob) AS outbox_id;

-- name: branch_tree
-- `phasegate inspect --tree` / GET /v1/workflows/{id}/branches: every fork and branch of a
-- run, with each branch's checkpoints (seq:phase:kind) in order.
SELECT f.fork_seq, f.mode, f.merge_phase, f.status AS fork_status, f.resolution, f.winner,
       f.branch_count, f.pending, b.branch, b.ordinal, b.status, b.next_seq, b.final_seq,
       b.current_phase, b.tier, b.tier_label, b.error,
       coalesce((SELECT array_agg(c.seq || ':' || c.phase || ':' || c.kind
                                  ORDER BY c.seq, c.checkpoint_id)
                   FROM checkpoints c
                  WHERE c.workflow_id = b.workflow_id AND c.branch = b.branch
                    AND c.kind IN ('phase', 'discarded')), '{}') AS steps
  FROM forks f
  JOIN branches b ON b.workflow_id = f.workflow_id AND b.parent_branch = f.parent_branch
                 AND b.fork_seq = f.fork_seq
 WHERE f.workflow_id = $1
 ORDER BY f.fork_seq, b.ordinal;
