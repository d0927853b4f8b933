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
