-- A branch's doors (phasegate/branch_doors.py): what the phase at seq $3 of branch $2 enters
-- by, and a branch stopped by its staleness check. Named queries, loaded like queries.sql.

-- name: branch_door
-- The checkpoint at seq $3 - 1 of the branch: how it ended (a below-tier 'retry'), what it
-- re-ran, its staleness envelope and age (database time), and how many attempts its phase has
-- had from the same input. No operator decision: reviews of a run are by the run's seq.
SELECT c.phase AS door_phase, c.outcome AS door_outcome, c.rerun_of AS door_rerun_of,
       c.resource_versions::text AS resource_versions,
       extract(epoch FROM now() - c.created_at)::float8 AS age_s,
       (SELECT count(*) FROM checkpoints k
         WHERE k.workflow_id = $1 AND k.branch = $2 AND k.kind = 'phase' AND k.seq < $3
           AND (k.seq = coalesce(c.rerun_of, c.seq) OR k.rerun_of = coalesce(c.rerun_of, c.seq))
       )::int AS door_attempts
  FROM checkpoints c
 WHERE c.workflow_id = $1 AND c.branch = $2 AND c.seq = $3 - 1 AND c.kind = 'phase';

-- name: branch_stale
-- The branch's observed resources changed: it stops as 'stale' with the reason ($4), at its
-- seq $3, while it and its run are still running. The caller holds its fork's lock and then
-- counts it like a failed branch (phasegate/branch_failures.py).
UPDATE branches
   SET status = 'stale', error = $4, updated_at = now(), finished_at = now()
 WHERE workflow_id = $1 AND branch = $2 AND next_seq = $3 AND status = 'running'
   AND EXISTS (SELECT 1 FROM workflow_runs r
                WHERE r.workflow_id = $1 AND r.status = 'running')
RETURNING branch;
