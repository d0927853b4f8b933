-- Worker presence (0015, phasegate/presence.py). A block starts with `-- name: <name>`.
-- One round trip each and no session state: safe behind PgBouncer in transaction mode.

-- name: report
-- A worker's own row. Times are database time: $2 and $8 are seconds the worker measured on
-- its monotonic clock (since it started, since its last emergency flush), never its wall
-- clock. last_flush_at moves only when the flush count does, so it does not wobble.
INSERT INTO worker_presence AS p (worker_id, started_at, last_seen, interval_s, in_flight,
                                  concurrency, watchdog, flushes, last_flush_at)
VALUES ($1, now() - make_interval(secs => $2::float8), now(), $3, $4, $5, $6, $7,
        now() - make_interval(secs => $8::float8))
ON CONFLICT (worker_id) DO UPDATE
   SET last_seen = now(), interval_s = EXCLUDED.interval_s, in_flight = EXCLUDED.in_flight,
       concurrency = EXCLUDED.concurrency, watchdog = EXCLUDED.watchdog,
       flushes = EXCLUDED.flushes, stopped_at = NULL,
       last_flush_at = CASE WHEN EXCLUDED.flushes <> p.flushes OR p.last_flush_at IS NULL
                            THEN EXCLUDED.last_flush_at ELSE p.last_flush_at END;

-- name: stopped
-- A worker that stops cleanly (scale-in, a deploy) leaves the live list at once.
UPDATE worker_presence SET stopped_at = now(), last_seen = now(), in_flight = 0
 WHERE worker_id = $1;

-- name: live
-- Workers seen within two of their own report intervals and not stopped, oldest first.
SELECT worker_id, started_at, last_seen, interval_s, in_flight, concurrency, watchdog,
       flushes, last_flush_at
  FROM worker_presence
 WHERE stopped_at IS NULL AND last_seen > now() - make_interval(secs => 2 * interval_s)
 ORDER BY started_at, worker_id
 LIMIT $1;

-- name: purge
-- Rows of workers gone (killed, scaled in, stopped) for longer than the retention.
DELETE FROM worker_presence WHERE last_seen < now() - make_interval(secs => $1::float8);
