-- The console's and the quarantine API's named queries (orchestrator/quarantine.py).
-- A block starts with `-- name: <name>`.

-- name: list_quarantine
-- Newest first, keyset-paged on quarantine_id ($1: below this id; NULL: from the newest).
-- The run's status rides along so a page can say whether a redrive is possible.
SELECT q.quarantine_id, q.message_id, q.workflow_id, q.reason, q.body_bytes, q.worker_id,
       q.created_at, q.redriven_at, q.redriven_by, r.workflow, r.status AS run_status,
       r.current_phase
  FROM quarantine q
  LEFT JOIN workflow_runs r ON r.workflow_id = q.workflow_id
 WHERE $1::bigint IS NULL OR q.quarantine_id < $1
 ORDER BY q.quarantine_id DESC
 LIMIT $2;

-- name: get_quarantine
SELECT q.quarantine_id, q.message_id, q.workflow_id, q.reason, q.body_bytes, q.worker_id,
       q.created_at, q.redriven_at, q.redriven_by, r.workflow, r.status AS run_status,
       r.current_phase
  FROM quarantine q
  LEFT JOIN workflow_runs r ON r.workflow_id = q.workflow_id
 WHERE q.quarantine_id = $1;

-- name: mark_redriven
-- Only the first redrive marks the row; a second one finds it marked and is refused.
UPDATE quarantine SET redriven_at = now(), redriven_by = $2
 WHERE quarantine_id = $1 AND redriven_at IS NULL
RETURNING quarantine_id;

-- name: count_quarantine
SELECT count(*) FILTER (WHERE redriven_at IS NULL) AS open, count(*) AS total FROM quarantine;

-- name: attempts_by_seq
-- Retries and review decisions per seq of a run: the timeline's retry column.
SELECT seq, count(*) FILTER (WHERE action IN ('retry', 'reject')) AS retries,
       count(*) AS actions
  FROM control_actions
 WHERE workflow_id = $1
 GROUP BY seq;

-- name: unmark_redriven
-- The resume behind a redrive was refused after the row was claimed: release the claim.
UPDATE quarantine SET redriven_at = NULL, redriven_by = NULL WHERE quarantine_id = $1;

-- name: attempts_of_run
-- The failed attempts of a run's phases, every branch, in the order they failed (0015).
SELECT branch, seq, phase, attempt, outcome, error, worker_id, failed_at
  FROM phase_attempts
 WHERE workflow_id = $1
 ORDER BY attempt_id
 LIMIT $2;

-- name: waits_of_run
-- The waits of a run's main chain: the successor rows with a due time (0010), the newest one
-- per seq. created_at: the commit that asked for the wait (same statement as its
-- checkpoint); due_at: when it was over (a signal's wake sets it to the signal's arrival);
-- resumed_at: when the next phase started (0015); the signal it waited for (0015) and the one
-- that ended it.
SELECT DISTINCT ON (o.seq)
       o.seq, o.created_at AS deferred_at, o.due_at, o.resumed_at, o.sent_at, o.wait_signal,
       s.name AS signal_name
  FROM outbox o
  LEFT JOIN signals s ON s.workflow_id = o.workflow_id AND s.consumed_seq = o.seq
 WHERE o.workflow_id = $1 AND o.branch = 'main' AND o.due_at IS NOT NULL
 ORDER BY o.seq, o.outbox_id DESC
 LIMIT $2;
