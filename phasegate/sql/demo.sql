-- What `phasegate demo` reads to draw its progress and check its result (phasegate/demo.py).
-- A block starts with `-- name: <name>`.

-- name: runs_by_status_and_phase
SELECT status, current_phase, count(*) AS n FROM workflow_runs GROUP BY 1, 2

-- name: runs
SELECT workflow_id, status, next_seq FROM workflow_runs

-- name: phase_checkpoints
SELECT workflow_id, seq, state::text AS state, state_hash FROM checkpoints
WHERE kind = 'phase' ORDER BY workflow_id, seq

-- name: unsent_outbox
SELECT count(*) FROM outbox WHERE sent_at IS NULL

-- name: quarantined
SELECT count(*) FROM quarantine
