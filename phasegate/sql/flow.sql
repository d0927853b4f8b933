-- Flow control's named queries: per-key concurrency (phasegate/concurrency.py) and schedules
-- (phasegate/schedules.py, orchestrator/scheduler.py). Schema: migration 0011. The decisions
-- themselves are the plpgsql functions of 0011, so each is one round trip and one transaction.

-- name: run_input
-- The input of a run the API created (its start message carries none).
SELECT input::text FROM workflow_runs WHERE workflow_id = $1;

-- name: admitted_by
-- The start messages of the runs that the end (or start) of run $1 admitted and that are
-- not sent yet: the worker that freed the slot sends them at once.
SELECT o.outbox_id, o.dedup_id, o.group_id, o.body
  FROM run_admissions a
  JOIN outbox o ON o.workflow_id = a.workflow_id AND o.dedup_id = a.dedup_id
 WHERE a.admitted_by = $1 AND a.workflow_id <> $1 AND o.sent_at IS NULL
 ORDER BY a.position;

-- name: schedule_register
-- The orchestrator's schedules, upserted at its start; first_seen stays what it was.
INSERT INTO schedules (name, workflow, cron) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE
   SET workflow = excluded.workflow, cron = excluded.cron, updated_at = now()
 WHERE (schedules.workflow, schedules.cron) IS DISTINCT FROM (excluded.workflow, excluded.cron);

-- name: schedule_marks
-- Database time, and per schedule the point after which ticks are due: its last claimed tick
-- (fired or skipped), else when it was first seen.
SELECT now() AS now, s.name,
       greatest(s.first_seen, (SELECT max(t.tick) FROM schedule_ticks t
                                WHERE t.schedule = s.name)) AS after
  FROM schedules s
 WHERE s.name = ANY($1::text[]);

-- name: schedule_claim
-- One tick, once: the primary key (schedule, tick) lets exactly one orchestrator insert it.
-- Returns the row only to the one that claimed it.
INSERT INTO schedule_ticks (schedule, tick, action, workflow_id, dedup_id, group_id, body)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (schedule, tick) DO NOTHING
RETURNING schedule, tick;

-- name: schedule_unsent
-- Claimed ticks whose start message is not sent yet (the claimer crashed before the send, or
-- the send failed): any orchestrator sends them; SKIP LOCKED keeps two from doing it at once.
SELECT schedule, tick, dedup_id, group_id, body
  FROM schedule_ticks
 WHERE sent_at IS NULL AND action = 'started' AND claimed_at < now() - make_interval(secs => $1)
 ORDER BY claimed_at
 LIMIT $2
   FOR UPDATE SKIP LOCKED;

-- name: schedule_sent
UPDATE schedule_ticks SET sent_at = now()
 WHERE schedule = $1 AND tick = $2 AND sent_at IS NULL;

-- name: schedule_prune
-- Ticks older than $2 seconds, except each schedule's newest (its high-water mark).
DELETE FROM schedule_ticks t
 WHERE t.schedule = $1 AND t.tick < now() - make_interval(secs => $2)
   AND t.tick < (SELECT max(tick) FROM schedule_ticks m WHERE m.schedule = $1)
   AND (t.sent_at IS NOT NULL OR t.action = 'skipped');
