-- Governance queries (docs/governance.md): residency-aware starts, a run's residency, the
-- access log. Same conventions as queries.sql: one statement, one round trip each.

-- name: ensure_run_resident
-- ensure_run that records the run's classification ($6) and region ($7, NULL: default).
INSERT INTO workflow_runs (workflow_id, workflow, schema_version, input, current_phase,
                           classification, region)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7)
ON CONFLICT (workflow_id) DO NOTHING
RETURNING workflow_id;

-- name: start_run_resident
-- start_run that records the run's classification ($9) and region ($10).
WITH run AS (
    INSERT INTO workflow_runs (workflow_id, workflow, schema_version, input, current_phase,
                               classification, region)
    VALUES ($1, $2, $3, $4::jsonb, $5, $9, $10)
    ON CONFLICT (workflow_id) DO NOTHING
    RETURNING workflow_id
), ob AS (
    INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body)
    SELECT workflow_id, 'main', 0, $6, $7, $8 FROM run
    RETURNING outbox_id
)
SELECT (SELECT outbox_id FROM ob) AS outbox_id;

-- name: run_residency
SELECT classification, region FROM workflow_runs WHERE workflow_id = $1;

-- name: access_log_append
-- One row per checkpoint whose state was read or refused ($4.. are parallel arrays).
INSERT INTO access_log (workflow_id, workflow, role, actor, phase, seq, branch, decision,
                        resource, reason)
SELECT $1, $2, $3, $9, p, s, b, d, 'checkpoint_state', r
  FROM unnest($4::text[], $5::int[], $6::text[], $7::text[], $8::text[]) AS t(p, s, b, d, r);

-- name: access_log_for_run
SELECT access_id, at, workflow_id, workflow, phase, seq, branch, role, decision, resource,
       reason, actor, db_user
  FROM access_log
 WHERE workflow_id = $1
 ORDER BY access_id;
