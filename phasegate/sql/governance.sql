-- Governance queries: a run's residency, the access log. Same conventions as queries.sql: one statement, one round trip each.

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
