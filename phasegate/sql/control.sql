-- The control plane's named queries. A block starts with `-- name: <name>`.
-- Reads serve the API and CLI; every write is ONE statement (a CTE), conditional on the state
-- the caller read just before, so a worker committing at the same moment wins or loses
-- cleanly and nothing is half-done.

-- name: get_run
-- updated_at: the run's last move. A commit that leaves its run running moves only the
-- position's updated_at (migrations 0021, 0023), so a live run's is the later of the two.
SELECT workflow_id, workflow, status, next_seq, base_seq, epoch, current_phase,
       schema_version, tier, tier_label, attempts, error, created_at,
       greatest(updated_at, (SELECT p.updated_at FROM run_positions p
                              WHERE p.workflow_id = workflow_runs.workflow_id)) AS updated_at,
       finished_at, classification, region, due_at, waiting_for
  FROM workflow_runs
 WHERE workflow_id = $1;

-- name: list_runs
-- Newest first, keyset-paginated on (created_at, workflow_id). `/*filters*/` is replaced by
-- fixed `AND column = $n` fragments (never by request text); see orchestrator/views.py.
-- updated_at as in get_run.
SELECT workflow_id, workflow, status, next_seq, base_seq, epoch, current_phase,
       schema_version, tier, tier_label, attempts, error, created_at,
       greatest(updated_at, (SELECT p.updated_at FROM run_positions p
                              WHERE p.workflow_id = workflow_runs.workflow_id)) AS updated_at,
       finished_at, classification, region, due_at, waiting_for
  FROM workflow_runs
 WHERE true /*filters*/
 ORDER BY created_at DESC, workflow_id DESC
 LIMIT $1;

-- name: checkpoints
-- The history of a run in commit order; state only when asked for ($2). The phase rows and
-- the rare kinds are read apart, each through its own index (migration 0026).
SELECT checkpoint_id, branch, seq, phase, kind, schema_version, state_hash, tier, tier_label,
       worker_id, created_at, CASE WHEN $2 THEN state::text END AS state
  FROM (SELECT * FROM checkpoints
         WHERE workflow_id = $1 AND kind = 'phase' AND checkpoint_id > $3
        UNION ALL
        SELECT * FROM checkpoints
         WHERE workflow_id = $1 AND kind <> 'phase' AND checkpoint_id > $3) AS history
 ORDER BY checkpoint_id
 LIMIT $4;

-- name: actions
SELECT action_id, action, from_status, seq, epoch, reason, actor, created_at
  FROM control_actions
 WHERE workflow_id = $1
 ORDER BY action_id DESC
 LIMIT $2;

-- name: stalls
-- Unfinished runs untouched for longer than $1 seconds, by workflow x phase x tier x status.
-- Every checkpoint commit touches the run's position (updated_at), so "untouched" means no
-- checkpoint, no failed attempt and no operator action in that time. Read from
-- run_positions (0017: the runs that have not ended, kept equal to their run rows), scanned
-- whole: no index on updated_at, so the commit's update of the run row stays HOT.
SELECT workflow, current_phase AS phase, tier, tier_label, status, count(*) AS runs,
       extract(epoch FROM now() - min(updated_at))::float8 AS oldest_age_s
  FROM run_positions
 WHERE status IN ('pending', 'running', 'awaiting_review')
   AND updated_at < now() - make_interval(secs => $1)
 GROUP BY workflow, current_phase, tier, tier_label, status
 ORDER BY oldest_age_s DESC
 LIMIT $2;

-- name: summary
-- The status table: unfinished and stopped runs by phase and tier (run_positions holds every
-- run that has not ended, 0017; failed runs come from workflow_runs); runs completed or
-- cancelled in the last $1 seconds only counted per workflow.
SELECT status, workflow, current_phase AS phase, tier, tier_label, count(*) AS runs,
       extract(epoch FROM now() - min(updated_at))::float8 AS oldest_age_s
  FROM (SELECT status, workflow, current_phase, tier, tier_label, updated_at
          FROM run_positions
        UNION ALL
        SELECT status, workflow, current_phase, tier, tier_label, updated_at
          FROM workflow_runs
         WHERE status = 'failed') live
 GROUP BY status, workflow, current_phase, tier, tier_label
UNION ALL
SELECT status, workflow, NULL, NULL, NULL, count(*), NULL
  FROM workflow_runs
 WHERE status IN ('completed', 'cancelled')
   AND finished_at > now() - make_interval(secs => $1)
 GROUP BY status, workflow
 ORDER BY 1, 2, 3, 4;

-- name: oldest_unfinished_age
SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
  FROM workflow_runs
 WHERE status IN ('pending', 'running', 'awaiting_review');

-- name: message_ages
-- The fleet page's message ages (database time, seconds; NULL: none). SQS keeps the age of its
-- oldest message for CloudWatch only (ApproximateAgeOfOldestMessage); this is what
-- PostgreSQL can tell of the main chains:
-- - not_started: a message whose phase has certainly not started: a pending run's start
--   message, since it was sent (the claim moves the run to running), and a finished wait,
--   since its due time (the claim clears `waiting`);
-- - uncommitted: a running run's latest successor, since it was sent, whose phase has not
--   committed: in the queue or running -- the database cannot tell which. A leased send
--   (worker/continuation.py) leaves no row until its lease runs out: its message went out
--   right after the commit of the seq before, whose checkpoint time stands for the send.
WITH heads AS (
    SELECT r.status, r.due_at,
           coalesce(
               (SELECT o.sent_at FROM outbox o
                 WHERE o.workflow_id = r.workflow_id AND o.branch = 'main'
                   AND o.seq = r.next_seq
                 ORDER BY o.outbox_id DESC LIMIT 1),
               (SELECT c.created_at FROM run_positions p
                  JOIN checkpoints c ON c.workflow_id = p.workflow_id AND c.branch = 'main'
                                    AND c.seq = r.next_seq - 1 AND c.kind = 'phase'
                 WHERE p.workflow_id = r.workflow_id AND r.status = 'running'
                   AND p.chain_holder LIKE '%/sent')) AS sent_at
      FROM workflow_runs r
     WHERE r.status IN ('pending', 'running')
        OR (r.status = 'waiting' AND r.due_at <= now())
), ready AS (
    SELECT status, sent_at,
           CASE WHEN status = 'pending' THEN sent_at WHEN status = 'waiting' THEN due_at END
               AS since
      FROM heads
)
SELECT extract(epoch FROM now() - min(since))::float8 AS not_started_s,
       count(since) AS not_started,
       extract(epoch FROM now() - min(sent_at) FILTER (WHERE status = 'running'))::float8
           AS uncommitted_s,
       count(sent_at) FILTER (WHERE status = 'running') AS uncommitted
  FROM ready;

-- name: runs_by_status
-- The exporter's phasegate_runs gauge: an index-only scan of workflow_runs_status_idx.
SELECT status, count(*)::bigint AS runs
  FROM workflow_runs
 GROUP BY status;

-- name: resume_run
-- retry, restart, approve, reject: the run back to running under a new epoch, the message
-- that resumes it in the outbox, and the action in the log -- one statement, applied only if
-- the run is still exactly as read ($2 status, $3 next_seq, $4 epoch). A timer row the run
-- left unsent (a wait it failed in, 0010) is deleted: the resuming message replaces it.
WITH run AS (
    UPDATE workflow_runs
       SET status = 'running', attempts = 0, error = NULL, epoch = epoch + 1,
           current_phase = $5, updated_at = now(), finished_at = NULL,
           base_seq = CASE WHEN $6 THEN next_seq ELSE base_seq END,
           schema_version = coalesce($7, schema_version)
     WHERE workflow_id = $1 AND status = $2 AND next_seq = $3 AND epoch = $4
    RETURNING workflow_id, next_seq, epoch
), disarmed AS (
    DELETE FROM outbox o USING run
     WHERE o.workflow_id = run.workflow_id AND o.sent_at IS NULL AND o.due_at IS NOT NULL
       AND o.seq > 0
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT workflow_id, 'main', next_seq, $8, $9, $10 FROM run
    RETURNING outbox_id
), act AS (
    INSERT INTO control_actions (workflow_id, action, from_status, seq, epoch, reason, actor)
    SELECT workflow_id, $11, $2, next_seq, epoch, $12, $13 FROM run
)
SELECT (SELECT outbox_id FROM ob) AS outbox_id;

-- name: cancel_run
-- A phase running now will fail its commit condition (status = 'running') and change nothing.
-- A waiting run's timer row (its successor, due later: 0010) is deleted with the cancel, so
-- nothing is sent at its due time. Only rows of a wait (seq > 0): a rate limit's wake-up
-- (seq 0, 0014) wakes its key's whole queue and stays. A row the relay is sending at this very
-- instant still arrives, and the worker drops it (the run is cancelled).
WITH run AS (
    UPDATE workflow_runs
       SET status = 'cancelled', updated_at = now(), finished_at = now(), due_at = NULL,
           waiting_for = NULL
     WHERE workflow_id = $1 AND status = $2
    RETURNING workflow_id, next_seq, epoch
), disarmed AS (
    DELETE FROM outbox o USING run
     WHERE o.workflow_id = run.workflow_id AND o.sent_at IS NULL AND o.due_at IS NOT NULL
       AND o.seq > 0
), act AS (
    INSERT INTO control_actions (workflow_id, action, from_status, seq, epoch, reason, actor)
    SELECT workflow_id, 'cancel', $2, next_seq, epoch, $3, $4 FROM run
)
SELECT workflow_id FROM run;

-- name: purge_count
-- What `phasegate purge` would delete: finished runs older than $1 (and older than their own
-- retention, when a run has one; of classification $2 when given), with their checkpoints and
-- outbox rows.
WITH victims AS (
    SELECT workflow_id FROM workflow_runs
     WHERE status IN ('completed', 'failed', 'cancelled')
       AND finished_at < now() - $1::interval
       AND (retention IS NULL OR finished_at < now() - retention)
       AND ($2::text IS NULL OR classification = $2)
)
SELECT (SELECT count(*) FROM victims) AS runs,
       (SELECT count(*) FROM checkpoints c JOIN victims v USING (workflow_id)
         WHERE c.kind = 'phase')
     + (SELECT count(*) FROM checkpoints c JOIN victims v USING (workflow_id)
         WHERE c.kind <> 'phase') AS checkpoints,
       (SELECT count(*) FROM outbox o JOIN victims v USING (workflow_id)) AS outbox;

-- name: purge_batch
-- One batch, oldest first. Rows locked by a concurrent purge are skipped; other tables that
-- reference workflow_runs go with ON DELETE CASCADE. The checkpoints are deleted here (phase
-- rows and the rare kinds apart, each through its index: 0026) to be counted; any committed
-- while the batch waited for a run's lock go with the run's trigger (0025).
WITH victims AS (
    SELECT workflow_id FROM workflow_runs
     WHERE status IN ('completed', 'failed', 'cancelled')
       AND finished_at < now() - $1::interval
       AND (retention IS NULL OR finished_at < now() - retention)
       AND ($3::text IS NULL OR classification = $3)
     ORDER BY finished_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), cp AS (
    DELETE FROM checkpoints c USING victims v
     WHERE c.workflow_id = v.workflow_id AND c.kind = 'phase' RETURNING 1
), rare AS (
    DELETE FROM checkpoints c USING victims v
     WHERE c.workflow_id = v.workflow_id AND c.kind <> 'phase' RETURNING 1
), ob AS (
    DELETE FROM outbox o USING victims v WHERE o.workflow_id = v.workflow_id RETURNING 1
), runs AS (
    DELETE FROM workflow_runs r USING victims v WHERE r.workflow_id = v.workflow_id RETURNING 1
)
SELECT (SELECT count(*) FROM runs) AS runs,
       (SELECT count(*) FROM cp) + (SELECT count(*) FROM rare) AS checkpoints,
       (SELECT count(*) FROM ob) AS outbox;

-- name: run_exists
SELECT 1 FROM workflow_runs WHERE workflow_id = $1

-- name: decision_by_key
-- A review decision sent before with this idempotency key (0019): which one, and the answer
-- its caller got (NULL: not kept yet -- that request is still finishing -- or a decision from
-- before 0019). A key used for a user signal comes back with its name, so it is refused.
SELECT name, outcome::text AS outcome
  FROM signals
 WHERE workflow_id = $1 AND idempotency_key = $2;

-- name: keep_decision_outcome
-- The first answer to a keyed decision, kept once: a second write changes nothing.
UPDATE signals SET outcome = $2::jsonb
 WHERE signal_id = $1 AND outcome IS NULL;
