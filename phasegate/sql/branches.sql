-- Branches: fork, branch phases, fan-in, race, review, supervisor merge (phasegate/branches.py,
-- phasegate/branch_review.py, orchestrator/branching.py; schema 0004_branches, 0012_branch_tree).
-- Named queries, loaded like queries.sql.
--
-- Locking order, everywhere: a fork row before any branch row of that fork, forks of deeper
-- levels before their parent branch's fork (a failure propagates upwards, nothing locks
-- downwards), then the run row. A branch's non-final commit is one statement that locks only
-- its own branch row, so it can never hold a lock another commit waits for while waiting
-- itself. The parent ("parent_branch") of a fork is 'main' or a branch: every statement that
-- moves a parent has a main variant (workflow_runs) and a branch variant (branches) as two
-- CTEs, of which exactly one matches.

-- name: fork_commit
-- A phase on the main chain or in a branch ($22, the parent) called ctx.fork: its checkpoint,
-- the parent moved to the merge phase (no message: the merge message is written by the
-- fan-in), the fork, one row per branch and one outbox start message per branch (each in its
-- own group) -- ONE statement, conditional on the parent still being at this seq, so a crash
-- never forks twice or half. $23 require_all, $24 the review budget, $25 the children's depth.
-- $26 a race's deadline in seconds (NULL: none): the fork's deadline_at and the 'deadline'
-- message ($27-$29), due then, on the parent chain at the merge seq; the relay sends it.
WITH run AS (
    UPDATE workflow_runs
       SET next_seq = $2 + 1, current_phase = $7, attempts = 0, error = NULL,
           tier = $8, tier_label = $9, updated_at = now()
     WHERE workflow_id = $1 AND next_seq = $2 AND status = 'running' AND $22::text = 'main'
    RETURNING workflow_id
), pb AS (
    UPDATE branches
       SET next_seq = $2 + 1, current_phase = $7, attempts = 0, error = NULL,
           tier = $8, tier_label = $9, updated_at = now()
     WHERE workflow_id = $1 AND branch = $22::text AND $22::text <> 'main' AND next_seq = $2
       AND status = 'running'
       AND EXISTS (SELECT 1 FROM workflow_runs r
                    WHERE r.workflow_id = $1 AND r.status = 'running')
    RETURNING workflow_id
), pos AS (
    SELECT workflow_id FROM run UNION ALL SELECT workflow_id FROM pb
), cp AS (
    INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                             state_hash, tier, tier_label, resource_versions, worker_id, trace_id)
    SELECT workflow_id, $22::text, $2, $3, 'phase', $4, $5::jsonb, $6, $8, $9, $10::jsonb, $11,
           $12
      FROM pos
    RETURNING created_at
), fk AS (
    INSERT INTO forks (workflow_id, parent_branch, fork_seq, mode, merge_phase, after_merge,
                       win_tier, branch_count, pending, require_all, max_retries, merge_seq,
                       deadline_at)
    SELECT workflow_id, $22::text, $2, $13, $7, $14, $15, cardinality($16::text[]),
           cardinality($16::text[]), $23, $24, $2 + 1,
           now() + make_interval(secs => $26::float8)
      FROM pos
    RETURNING workflow_id, deadline_at
), dl AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body, due_at)
    SELECT workflow_id, $22::text, $2 + 1, $27::text, $28::text, $29::text, deadline_at
      FROM fk WHERE deadline_at IS NOT NULL
), br AS (
    INSERT INTO branches (workflow_id, branch, parent_branch, fork_seq, ordinal, next_seq,
                          current_phase, input, depth)
    SELECT fk.workflow_id, b.name, $22::text, $2, (b.ord - 1)::int, $2 + 1, $18, b.input::jsonb,
           $25
      FROM fk, unnest($16::text[], $17::text[]) WITH ORDINALITY AS b(name, input, ord)
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT pos.workflow_id, m.branch, $2 + 1, m.dedup, m.grp, m.body
      FROM pos, unnest($16::text[], $19::text[], $20::text[], $21::text[])
                AS m(branch, dedup, grp, body)
    RETURNING outbox_id, dedup_id
)
SELECT cp.created_at AS committed_at, ob.outbox_id, ob.dedup_id
  FROM cp LEFT JOIN ob ON true;

-- name: live_branches
-- The live-branch bound: branches of the run still running whose every ancestor is running
-- too (a branch under a discarded one is dead, even before its next message finds out).
WITH RECURSIVE live AS (
    SELECT branch FROM branches
     WHERE workflow_id = $1 AND parent_branch = 'main' AND status = 'running'
    UNION ALL
    SELECT b.branch FROM branches b JOIN live ON b.parent_branch = live.branch
     WHERE b.workflow_id = $1 AND b.status = 'running'
)
SELECT count(*) FROM live;

-- name: load_branch
-- load_for_phase for a branch: the branch's position (status is the run's when the run is not
-- running, 'discarded' when an ancestor branch is no longer running), its fork, the state
-- committed at its previous door and in-phase progress.
WITH RECURSIVE up AS (
    SELECT parent_branch AS branch FROM branches WHERE workflow_id = $1 AND branch = $2
    UNION ALL
    SELECT p.parent_branch FROM branches p JOIN up ON p.branch = up.branch
     WHERE p.workflow_id = $1
)
SELECT b.workflow_id, r.workflow,
       CASE WHEN r.status <> 'running' THEN r.status
            WHEN b.status = 'running' AND EXISTS (
                SELECT 1 FROM branches a JOIN up ON a.branch = up.branch
                 WHERE a.workflow_id = $1 AND a.status <> 'running') THEN 'discarded'
            ELSE b.status END AS status, b.status AS own_status,
       b.next_seq, coalesce(b.base_seq, b.fork_seq + 1) AS base_seq, b.current_phase,
       r.schema_version, b.input::text AS input, b.attempts, r.epoch,
       c.state::text AS state, c.state_hash, c.schema_version AS state_version,
       e.state::text AS progress,
       b.fork_seq, b.parent_branch, b.depth, f.mode, f.merge_phase, f.win_tier
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

-- name: branch_orphaned
-- A branch whose ancestor was discarded or failed found out (load_branch said 'discarded'):
-- record it as discarded, so it stops counting as live. Its own row only.
UPDATE branches SET status = 'discarded', updated_at = now(),
       finished_at = coalesce(finished_at, now())
 WHERE workflow_id = $1 AND branch = $2 AND status = 'running'
RETURNING branch;

-- name: branch_commit
-- commit_phase for a branch: checkpoint + branch position + the branch's next message, one
-- statement, conditional on the branch still being at this seq and running and on the run
-- still running. $9 final: the branch is done (its next phase is the merge phase, or it
-- reached its race's win tier); its final state is this checkpoint. $18/$19: a below-tier
-- retry's outcome ('retry') and the seq of the phase's first attempt (phasegate/branch_doors.py).
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
                             state_hash, tier, tier_label, resource_versions, worker_id, trace_id,
                             outcome, rerun_of)
    SELECT workflow_id, $2, $3, $4, 'phase', $5, $6::jsonb, $7, $10, $11, $12::jsonb, $13, $14,
           $18::text, $19::int
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
SELECT status, mode, pending, merge_phase, after_merge, require_all, max_retries, retries,
       coalesce(merge_seq, fork_seq + 1) AS merge_seq
  FROM forks
 WHERE workflow_id = $1 AND parent_branch = $3 AND fork_seq = $2
   FOR UPDATE;

-- name: branch_fork
-- Which fork a branch belongs to (a failing branch's transaction locks it first).
SELECT parent_branch, fork_seq FROM branches WHERE workflow_id = $1 AND branch = $2;

-- name: fork_settle
-- After a branch's final commit or failure, in the same transaction, under the fork lock:
-- count it, and when $3 (resolution) is set, resolve the fork -- branches merged (race: the
-- winner $4 merged, the others discarded; failed ones stay failed), the parent touched and the
-- merge message in the outbox at the fork's merge seq on the parent ($8) chain.
WITH fk AS (
    UPDATE forks
       SET pending = pending - 1,
           status = CASE WHEN $3::text IS NOT NULL THEN 'merged' ELSE status END,
           resolution = $3, winner = $4::text,
           resolved_at = CASE WHEN $3::text IS NOT NULL THEN now() END
     WHERE workflow_id = $1 AND parent_branch = $8 AND fork_seq = $2 AND status = 'open'
    RETURNING workflow_id, coalesce(merge_seq, fork_seq + 1) AS merge_seq
), settled AS (
    UPDATE branches
       SET status = CASE WHEN $4::text IS NULL OR branch = $4::text THEN 'merged'
                         ELSE 'discarded' END,
           updated_at = now(), finished_at = coalesce(finished_at, now())
     WHERE workflow_id = $1 AND parent_branch = $8 AND fork_seq = $2
       AND $3::text IS NOT NULL AND status IN ('running', 'completed')
       AND EXISTS (SELECT 1 FROM fk)
), run AS (
    UPDATE workflow_runs r SET updated_at = now()
      FROM fk
     WHERE r.workflow_id = $1 AND r.next_seq = fk.merge_seq AND r.status = 'running'
       AND $3::text IS NOT NULL AND $8 = 'main'
    RETURNING fk.merge_seq
), pb AS (
    -- A read, not a lock: the parent branch's row belongs to the fork above this one.
    SELECT fk.merge_seq FROM branches p, fk
     WHERE p.workflow_id = $1 AND p.branch = $8 AND $8 <> 'main' AND p.next_seq = fk.merge_seq
       AND p.status = 'running' AND $3::text IS NOT NULL
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT $1, $8, at.merge_seq, $5, $6, $7
      FROM (SELECT merge_seq FROM run UNION ALL SELECT merge_seq FROM pb) AS at
    RETURNING outbox_id
)
SELECT EXISTS (SELECT 1 FROM fk) AS settled, (SELECT outbox_id FROM ob) AS outbox_id;

-- name: fork_failed
-- Under the fork lock: the fork cannot succeed (every branch of a race failed, or a branch of
-- a require="all" fork failed). The fork is closed as failed; the caller then fails the parent
-- (the run, or the parent branch one level up). Its branches are left as they are: the failed
-- parent stops them (a branch commits only while its run and ancestors run), and an operator
-- can still promote one of them with a supervisor merge of the failed run.
UPDATE forks
   SET status = 'failed', resolution = 'failed', pending = 0, resolved_at = now()
 WHERE workflow_id = $1 AND parent_branch = $3 AND fork_seq = $2 AND status = 'open';

-- name: run_fail
-- The run fails with the reason (a failed fork of the main chain).
UPDATE workflow_runs
   SET status = 'failed', error = $2, updated_at = now(), finished_at = now()
 WHERE workflow_id = $1 AND status = 'running'
RETURNING workflow_id;

-- name: branch_fail
-- A parent branch fails because its own fork failed (one level up: counted like a failed
-- phase at its limit). The caller holds the lock of the fork the branch belongs to.
UPDATE branches
   SET status = 'failed', error = $3, updated_at = now(), finished_at = now()
 WHERE workflow_id = $1 AND branch = $2 AND status = 'running'
RETURNING branch;

-- name: branch_discarded
-- A branch phase whose commit failed because its branch was discarded: record what it
-- produced as a 'discarded' checkpoint (never part of a chain, never merged). The branch row
-- is read FOR KEY SHARE: deleting the run (which deletes its branches) waits for it, and a
-- write that comes after finds no branch, so no checkpoint outlives its run (0025).
INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                         state_hash, tier, tier_label, worker_id, trace_id)
SELECT b.workflow_id, b.branch, $3, $4, 'discarded', $5, $6::jsonb, $7, $8, $9, $10, $11
  FROM branches b
 WHERE b.workflow_id = $1 AND b.branch = $2 AND b.status = 'discarded' AND b.next_seq = $3
   AND NOT EXISTS (SELECT 1 FROM checkpoints c
                    WHERE c.workflow_id = $1 AND c.branch = $2 AND c.seq = $3
                      AND c.kind = 'discarded')
   FOR KEY SHARE OF b
RETURNING checkpoint_id;

-- name: branch_failure
-- A branch phase raised: count the attempt on the branch; at the limit the branch is failed.
-- Whether that fails the run is decided under the fork lock (phasegate/branches.py). The
-- attempt is kept as record_failure keeps it (0015, phase_attempts); $6 phase, $7 worker.
WITH br AS (
    UPDATE branches
       SET attempts = attempts + 1, error = $3, updated_at = now(),
           status = CASE WHEN attempts + 1 >= $5 THEN 'failed' ELSE status END,
           finished_at = CASE WHEN attempts + 1 >= $5 THEN now() ELSE finished_at END
     WHERE workflow_id = $1 AND branch = $2 AND next_seq = $4 AND status = 'running'
       AND EXISTS (SELECT 1 FROM workflow_runs r
                    WHERE r.workflow_id = $1 AND r.status = 'running')
    RETURNING attempts, status
), kept AS (
    INSERT INTO phase_attempts (workflow_id, branch, seq, phase, attempt, outcome, error,
                                worker_id)
    SELECT $1, $2, $4, $6::text, attempts,
           CASE WHEN status = 'failed' THEN 'failed' ELSE 'retry' END, $3, $7::text
      FROM br
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
-- What a merge phase at seq $2 of chain $5 receives: the newest fork of this life of the
-- chain ($4: its base_seq) that merges into phase $3, and each of its merged, failed or stale
-- branches in fork order (a merged one with its final state). fork_status 'open': the fan-in
-- has not happened (the message is premature).
WITH f AS (
    SELECT fork_seq, status, resolution, max_retries - retries AS retries_left
      FROM forks
     WHERE workflow_id = $1 AND parent_branch = $5 AND fork_seq < $2
       AND fork_seq >= $4 AND merge_phase = $3
     ORDER BY fork_seq DESC
     LIMIT 1
)
SELECT f.fork_seq, f.status AS fork_status, f.resolution, f.retries_left,
       (SELECT k.phase FROM checkpoints k
         WHERE k.workflow_id = $1 AND k.branch = $5 AND k.seq = f.fork_seq
           AND k.kind = 'phase') AS fork_phase, b.branch,
       b.status AS branch_status, b.error, b.retries, b.input::text AS input, b.final_seq,
       b.tier, b.tier_label, c.state::text AS state, c.state_hash,
       c.schema_version AS state_version
  FROM f
  LEFT JOIN branches b
         ON b.workflow_id = $1 AND b.parent_branch = $5 AND b.fork_seq = f.fork_seq
        AND b.status IN ('merged', 'failed', 'stale')
  LEFT JOIN checkpoints c
         ON c.workflow_id = $1 AND c.branch = b.branch AND c.seq = b.final_seq
        AND c.kind = 'phase' AND b.status = 'merged'
 ORDER BY b.ordinal;

-- name: open_fork_lock
-- Supervisor merge: the run's open fork (the newest; or one that failed and failed the run),
-- locked like a branch's final commit.
SELECT f.fork_seq, f.merge_phase, f.after_merge, r.workflow, r.status AS run_status,
       r.next_seq, r.epoch, coalesce(f.merge_seq, f.fork_seq + 1) AS merge_seq
  FROM forks f
  JOIN workflow_runs r ON r.workflow_id = f.workflow_id
 WHERE f.workflow_id = $1 AND f.parent_branch = 'main' AND f.status IN ('open', 'failed')
 ORDER BY f.fork_seq DESC
 LIMIT 1
   FOR UPDATE OF f;

-- name: supervisor_merge
-- Promote branch $2's latest committed state to the main chain at the merge seq ($12; $3 is
-- fork_seq; a stale branch too, and after a race's deadline one of its discarded branches): a main checkpoint recording its source branch, the run moved past the merge
-- phase (completed if it was the last), the fork resolved ('supervisor', winner $2), the
-- branch merged and its siblings discarded, the action logged and the next main message in
-- the outbox -- one statement, under the fork lock, conditional on the run as read.
WITH src AS (
    SELECT c.seq, c.state, c.state_hash, c.schema_version, c.tier, c.tier_label
      FROM branches b
      JOIN checkpoints c ON c.workflow_id = b.workflow_id AND c.branch = b.branch
                        AND c.kind = 'phase'
     WHERE b.workflow_id = $1 AND b.branch = $2 AND b.parent_branch = 'main'
       AND b.fork_seq = $3
       AND (b.status IN ('running', 'completed', 'failed', 'stale')
            OR b.status = 'discarded' AND EXISTS (
                SELECT 1 FROM forks f WHERE f.workflow_id = $1 AND f.parent_branch = 'main'
                   AND f.fork_seq = $3 AND f.resolution = 'deadline'))
     ORDER BY c.seq DESC
     LIMIT 1
), run AS (
    UPDATE workflow_runs
       SET next_seq = $12 + 1, current_phase = coalesce($5, $4),
           status = CASE WHEN $5::text IS NULL THEN 'completed' ELSE 'running' END,
           attempts = 0, error = NULL, updated_at = now(),
           finished_at = CASE WHEN $5::text IS NULL THEN now() END
     WHERE workflow_id = $1 AND next_seq = $12 AND status = $6
       AND EXISTS (SELECT 1 FROM src)
    RETURNING workflow_id, next_seq, epoch
), cp AS (
    INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                             state_hash, tier, tier_label, worker_id, source_branch)
    SELECT run.workflow_id, 'main', $12, $4, 'phase', src.schema_version, src.state,
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
       AND (b.status IN ('running', 'completed', 'failed', 'stale') OR b.branch = $2)
       AND EXISTS (SELECT 1 FROM run)
), act AS (
    INSERT INTO control_actions (workflow_id, action, from_status, seq, epoch, reason, actor)
    SELECT workflow_id, 'merge', $6, $12, epoch, $7, $8 FROM run
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT workflow_id, 'main', next_seq, $9, $10, $11 FROM run WHERE $9::text IS NOT NULL
    RETURNING outbox_id
)
SELECT (SELECT created_at FROM cp) AS committed_at, (SELECT outbox_id FROM ob) AS outbox_id;

-- name: branch_tree
-- `phasegate inspect --tree` / GET /v1/workflows/{id}/branches: every fork and branch of a
-- run (nested forks name their parent branch), with each branch's checkpoints
-- (seq:phase:kind) in order (the phase and the discarded rows read apart, each through its
-- index: migration 0026).
SELECT f.parent_branch, f.fork_seq, f.mode, f.merge_phase, f.status AS fork_status,
       f.resolution, f.winner, f.branch_count, f.pending, f.require_all, f.retries AS
       fork_retries, f.max_retries, coalesce(f.merge_seq, f.fork_seq + 1) AS merge_seq,
       f.deadline_at,
       b.branch, b.ordinal, b.depth, b.status, b.next_seq, b.final_seq, b.current_phase,
       b.tier, b.tier_label, b.error, b.retries,
       coalesce((SELECT array_agg(c.seq || ':' || c.phase || ':' || c.kind
                                  ORDER BY c.seq, c.checkpoint_id)
                   FROM (SELECT seq, phase, kind, checkpoint_id FROM checkpoints
                          WHERE workflow_id = b.workflow_id AND branch = b.branch
                            AND kind = 'phase'
                         UNION ALL
                         SELECT seq, phase, kind, checkpoint_id FROM checkpoints
                          WHERE workflow_id = b.workflow_id AND branch = b.branch
                            AND kind = 'discarded') AS c), '{}') AS steps
  FROM forks f
  JOIN branches b ON b.workflow_id = f.workflow_id AND b.parent_branch = f.parent_branch
                 AND b.fork_seq = f.fork_seq
 WHERE f.workflow_id = $1
 ORDER BY b.depth, f.parent_branch, f.fork_seq, b.ordinal;

-- name: fork_branches
-- A review round, under the fork lock: the fork's branches and where each one stands.
SELECT branch, status, next_seq FROM branches
 WHERE workflow_id = $1 AND parent_branch = $2 AND fork_seq = $3
 ORDER BY ordinal;

-- name: review_commit
-- A merge phase that asked to retry branches ($13, each with a new input $14 or NULL: the
-- same one), under the fork lock: the merge phase's checkpoint at its seq $3 on the parent
-- chain $2 (the state the next round receives), the parent moved one seq on (still at the
-- merge phase), the fork reopened with the retried branches pending and the merge seq moved,
-- each retried branch started again as a new attempt (its base seq: its next seq + 1, so no
-- step record of the old attempt is replayed), the branches in $15 discarded and one start
-- message per retried branch -- ONE statement, and nothing at all unless the parent is still
-- at $3 and the fork's retry budget covers the retries. A reopened race has no deadline.
WITH ok AS (
    SELECT 1 FROM forks
     WHERE workflow_id = $1 AND parent_branch = $2 AND fork_seq = $12 AND status = 'merged'
       AND retries + cardinality($13::text[]) <= max_retries
), run AS (
    UPDATE workflow_runs
       SET next_seq = $3 + 1, attempts = 0, error = NULL, tier = $8, tier_label = $9,
           updated_at = now()
     WHERE workflow_id = $1 AND $2::text = 'main' AND next_seq = $3 AND status = 'running'
       AND EXISTS (SELECT 1 FROM ok)
    RETURNING workflow_id
), pb AS (
    UPDATE branches
       SET next_seq = $3 + 1, attempts = 0, error = NULL, tier = $8, tier_label = $9,
           updated_at = now()
     WHERE workflow_id = $1 AND branch = $2::text AND $2::text <> 'main' AND next_seq = $3
       AND status = 'running' AND EXISTS (SELECT 1 FROM ok)
       AND EXISTS (SELECT 1 FROM workflow_runs r
                    WHERE r.workflow_id = $1 AND r.status = 'running')
    RETURNING workflow_id
), pos AS (
    SELECT workflow_id FROM run UNION ALL SELECT workflow_id FROM pb
), cp AS (
    INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                             state_hash, tier, tier_label, worker_id, trace_id)
    SELECT workflow_id, $2::text, $3, $4, 'phase', $5, $6::jsonb, $7, $8, $9, $10, $11
      FROM pos
    RETURNING created_at
), fk AS (
    UPDATE forks
       SET status = 'open', resolution = NULL, winner = NULL, resolved_at = NULL,
           pending = cardinality($13::text[]),
           retries = retries + cardinality($13::text[]), merge_seq = $3 + 1,
           deadline_at = NULL
     WHERE workflow_id = $1 AND parent_branch = $2 AND fork_seq = $12
       AND EXISTS (SELECT 1 FROM pos)
    RETURNING workflow_id
), rb AS (
    UPDATE branches b
       SET status = 'running', next_seq = b.next_seq + 1, base_seq = b.next_seq + 1,
           input = coalesce(r.input::jsonb, b.input), current_phase = $16, final_seq = NULL,
           attempts = 0, error = NULL, tier = NULL, tier_label = NULL,
           retries = b.retries + 1, finished_at = NULL, updated_at = now()
      FROM unnest($13::text[], $14::text[]) AS r(name, input)
     WHERE b.workflow_id = $1 AND b.branch = r.name AND b.parent_branch = $2
       AND b.fork_seq = $12 AND b.status IN ('merged', 'failed', 'stale')
       AND EXISTS (SELECT 1 FROM fk)
), db AS (
    UPDATE branches
       SET status = 'discarded', updated_at = now()
     WHERE workflow_id = $1 AND branch = ANY($15::text[]) AND parent_branch = $2
       AND fork_seq = $12 AND status IN ('merged', 'failed', 'stale')
       AND EXISTS (SELECT 1 FROM pos)
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT $1, m.branch, m.seq, m.dedup, m.grp, m.body
      FROM fk, unnest($13::text[], $17::int[], $18::text[], $19::text[], $20::text[])
                AS m(branch, seq, dedup, grp, body)
    RETURNING outbox_id, dedup_id
)
SELECT cp.created_at AS committed_at, ob.outbox_id, ob.dedup_id
  FROM cp LEFT JOIN ob ON true;

-- name: review_discards
-- A merge phase that discarded branches without retrying any: their status, written just
-- before the merge phase's own commit and only while the parent is still at the merge seq
-- $4 (a re-run of the merge phase writes the same again; a late duplicate writes nothing).
UPDATE branches b
   SET status = 'discarded', updated_at = now()
 WHERE b.workflow_id = $1 AND b.parent_branch = $2 AND b.fork_seq = $3
   AND b.branch = ANY($5::text[]) AND b.status IN ('merged', 'failed', 'stale')
   AND (EXISTS (SELECT 1 FROM workflow_runs r
                 WHERE r.workflow_id = $1 AND $2 = 'main' AND r.next_seq = $4
                   AND r.status = 'running')
        OR EXISTS (SELECT 1 FROM branches p
                    WHERE p.workflow_id = $1 AND p.branch = $2 AND p.next_seq = $4
                      AND p.status = 'running'));

-- name: race_deadline
-- A race's deadline message arrived ($3 fork_seq on the parent chain $2), under the fork lock:
-- ONE statement, conditional on the fork still being an open race whose deadline has passed
-- (database time) and on its parent still running. Then the fork fails ('deadline'), every
-- live branch of it is discarded and, on the main chain, the run fails with the reason ($4:
-- the error's name). A race won meanwhile (or failed, or reviewed: its deadline cleared)
-- matches nothing: the message changes nothing. A parent branch is failed by the caller, one
-- level up, as a failed fork does (phasegate/branch_failures.py).
WITH fk AS (
    UPDATE forks f
       SET status = 'failed', resolution = 'deadline', pending = 0, resolved_at = now()
     WHERE f.workflow_id = $1 AND f.parent_branch = $2 AND f.fork_seq = $3
       AND f.status = 'open' AND f.mode = 'race' AND f.deadline_at <= now()
       AND EXISTS (SELECT 1 FROM workflow_runs r
                    WHERE r.workflow_id = $1 AND r.status = 'running')
       AND ($2 = 'main' OR EXISTS (SELECT 1 FROM branches p
                                    WHERE p.workflow_id = $1 AND p.branch = $2
                                      AND p.status = 'running'))
    RETURNING format('%s: no branch of the race at %s seq %s won within its deadline of %s s',
                     $4::text, $2::text, $3::int,
                     trim_scale(round(extract(epoch FROM f.deadline_at - f.created_at), 3)))
              AS reason
), dropped AS (
    UPDATE branches b
       SET status = 'discarded', updated_at = now(), finished_at = coalesce(b.finished_at, now())
     WHERE b.workflow_id = $1 AND b.parent_branch = $2 AND b.fork_seq = $3
       AND b.status IN ('running', 'completed') AND EXISTS (SELECT 1 FROM fk)
    RETURNING b.branch
), run AS (
    UPDATE workflow_runs r
       SET status = 'failed', error = (SELECT reason FROM fk), updated_at = now(),
           finished_at = now()
     WHERE r.workflow_id = $1 AND $2 = 'main' AND r.status = 'running'
       AND EXISTS (SELECT 1 FROM fk)
    RETURNING r.workflow_id
)
SELECT (SELECT reason FROM fk) AS reason, (SELECT count(*) FROM dropped)::int AS discarded,
       EXISTS (SELECT 1 FROM run) AS run_failed;
