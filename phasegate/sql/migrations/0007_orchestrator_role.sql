-- The orchestrator's group role (cluster-wide, NOLOGIN), like the three of 0005: the HTTP
-- API, the outbox relay and the exporter run with exactly the privileges below, so a bug or a
-- compromised token in the control plane cannot alter the schema, delete history or read the
-- access log. Grant it to the orchestrator's login user, e.g.
-- `CREATE ROLE orchestrator_pod LOGIN PASSWORD '...' IN ROLE phasegate_orchestrator`.
-- `phasegate purge` deletes finished runs: it runs as the schema owner (the migration job's
-- user), not as this role.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_orchestrator') THEN
        BEGIN
            CREATE ROLE phasegate_orchestrator NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- another database's migration created it a moment ago
        END;
    END IF;
END $$;

GRANT USAGE ON SCHEMA public TO phasegate_orchestrator;

-- Startup: is the schema new enough.
GRANT SELECT ON phasegate_migrations TO phasegate_orchestrator;
-- Start (run row + first outbox row), cancel/retry/restart/approve/reject (run row, outbox
-- row, action row), the relay (claim and mark outbox rows, requeue stalled ones).
GRANT SELECT, INSERT, UPDATE ON workflow_runs, outbox TO phasegate_orchestrator;
GRANT SELECT, INSERT ON control_actions TO phasegate_orchestrator;
-- Reads of checkpoints; a supervisor merge appends one.
GRANT SELECT, INSERT ON checkpoints TO phasegate_orchestrator;
-- Branch views and the supervisor merge (which locks and settles the fork).
GRANT SELECT, UPDATE ON forks, branches TO phasegate_orchestrator;
-- Every state read and denial is logged; reading the log is the auditor's, not the API's.
GRANT INSERT ON access_log TO phasegate_orchestrator;
