-- Signals (0010, phasegate/signals.py). A block starts with `-- name: <name>`.
-- Sending one is a short transaction: lock the run row, then wake the wait it satisfies.
-- The lock serialises signals of one run with each other and with the phase commit.

-- name: lock_run
SELECT status, next_seq, waiting_for, (due_at > now()) AS before_due, workflow,
       current_phase, epoch, region
  FROM workflow_runs
 WHERE workflow_id = $1
   FOR UPDATE;

-- name: find_by_key
SELECT signal_id, consumed_seq FROM signals WHERE workflow_id = $1 AND idempotency_key = $2;

-- name: wake
-- The waiting row of the run's next seq becomes due now, unless the relay already sent it
-- (the timeout won; the relay holds the row locked while it sends, so this waits and then
-- sees sent_at set).
UPDATE outbox SET due_at = now()
 WHERE workflow_id = $1 AND branch = 'main' AND seq = $2 AND sent_at IS NULL
   AND due_at > now()
RETURNING outbox_id, dedup_id, group_id, body;

-- name: woken_run
UPDATE workflow_runs SET due_at = now(), updated_at = now() WHERE workflow_id = $1;

-- name: insert
-- $5: the seq it is delivered to (NULL: kept until a wait for its name).
INSERT INTO signals (workflow_id, name, payload, idempotency_key, consumed_seq, consumed_at,
                     actor)
VALUES ($1, $2, $3::jsonb, $4, $5, CASE WHEN $5::int IS NOT NULL THEN now() END, $6)
ON CONFLICT (workflow_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING signal_id;

-- name: decide
-- A review decision (0014): the signal phasegate.approve / phasegate.reject ($7), delivered to
-- the run's next seq under the epoch it starts, with what every resume writes: the run back to
-- running under that epoch, the message that resumes it (its dedup id carries the epoch), the
-- action in control_actions. Under the run's lock (lock_run); applied only if the run is still
-- awaiting review at next_seq $2 and epoch $3.
WITH run AS (
    UPDATE workflow_runs
       SET status = 'running', attempts = 0, error = NULL, epoch = epoch + 1,
           updated_at = now(), finished_at = NULL
     WHERE workflow_id = $1 AND status = 'awaiting_review' AND next_seq = $2 AND epoch = $3
    RETURNING workflow_id, next_seq, epoch
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT workflow_id, 'main', next_seq, $4, $5, $6 FROM run
    RETURNING outbox_id, dedup_id, group_id, body
), sig AS (
    INSERT INTO signals (workflow_id, name, payload, idempotency_key, consumed_seq,
                         consumed_epoch, consumed_at, actor)
    SELECT workflow_id, $7, $8::jsonb, $9, next_seq, epoch, now(), $10 FROM run
    RETURNING signal_id
), act AS (
    INSERT INTO control_actions (workflow_id, action, from_status, seq, epoch, reason, actor)
    SELECT workflow_id, $11, 'awaiting_review', next_seq, epoch, $12, $10 FROM run
)
SELECT ob.outbox_id, ob.dedup_id, ob.group_id, ob.body, sig.signal_id FROM ob, sig;

-- name: list
SELECT signal_id, name, idempotency_key, consumed_seq, actor, created_at, consumed_at
  FROM signals WHERE workflow_id = $1 ORDER BY signal_id;

-- name: wake_kept
-- Relay: a waiting run whose wait a kept signal already satisfies. The one race the signal's
-- own transaction cannot see: a signal committed while the waiting phase's commit statement
-- ran on an older snapshot (it was kept, and the commit did not find it). The run row is
-- locked (SKIP LOCKED: a signal being sent right now settles it itself), the signal is
-- handed to the next seq and the waiting row made due now.
WITH w AS (
    SELECT r.workflow_id, r.next_seq,
           (SELECT min(s.signal_id) FROM signals s
             WHERE s.workflow_id = r.workflow_id AND s.name = r.waiting_for
               AND s.consumed_seq IS NULL) AS signal_id
      FROM workflow_runs r
     WHERE r.status = 'waiting' AND r.waiting_for IS NOT NULL AND r.due_at > now()
       AND EXISTS (SELECT 1 FROM signals k
                    WHERE k.workflow_id = r.workflow_id AND k.name = r.waiting_for
                      AND k.consumed_seq IS NULL)
     LIMIT $1
       FOR UPDATE OF r SKIP LOCKED
), ob AS (
    UPDATE outbox o SET due_at = now()
      FROM w
     WHERE o.workflow_id = w.workflow_id AND o.branch = 'main' AND o.seq = w.next_seq
       AND o.sent_at IS NULL AND o.due_at > now()
    RETURNING o.workflow_id
), sig AS (
    UPDATE signals s SET consumed_seq = w.next_seq, consumed_at = now()
      FROM w
     WHERE s.signal_id = w.signal_id AND w.workflow_id IN (SELECT workflow_id FROM ob)
    RETURNING s.workflow_id
)
UPDATE workflow_runs r SET due_at = now(), updated_at = now()
  FROM sig
 WHERE r.workflow_id = sig.workflow_id
RETURNING r.workflow_id;

-- name: due_soon
-- The exporter's phasegate_timers_due_soon: waiting runs whose row falls due within $1
-- seconds or is due and not sent yet (the fleet should be awake for them), queued runs'
-- rate-limit wake-ups (0014: the worker that receives one admits the key's queue), and the
-- 'deadline' messages of open races (0016, phasegate/race_deadline.py: the run is running,
-- but with every branch held up the fleet may be at zero when the deadline falls due). A
-- cancelled run's row is not counted: its message would only be dropped; nor is a race's
-- once it was won or failed (its fork is no longer open), nor one whose deadline a review
-- round cleared: those messages change nothing.
SELECT count(*)::bigint
  FROM outbox o
  JOIN workflow_runs r ON r.workflow_id = o.workflow_id
 WHERE o.sent_at IS NULL AND o.due_at IS NOT NULL
   AND o.due_at <= now() + make_interval(secs => $1)
   AND (r.status IN ('waiting', 'queued')
        OR (r.status = 'running' AND EXISTS (
               SELECT 1 FROM forks f
                WHERE f.workflow_id = o.workflow_id AND f.parent_branch = o.branch
                  AND f.fork_seq = o.seq - 1 AND f.mode = 'race' AND f.status = 'open'
                  AND f.deadline_at = o.due_at)));
