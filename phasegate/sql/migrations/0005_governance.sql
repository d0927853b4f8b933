-- phasegate schema v5: governance. Data residency (classification and region fixed at start),
-- an append-only access log, and three NOLOGIN group roles the operator grants to login users.
-- See README, "Governance". Re-running any statement here is harmless (idempotent).

-- A run's classification is one of four; its region (NULL: the default store) and its
-- classification are fixed when the run is created.
ALTER TABLE workflow_runs DROP CONSTRAINT IF EXISTS workflow_runs_classification_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_classification_check
    CHECK (classification IN ('public', 'internal', 'sensitive', 'regulated'));
ALTER TABLE workflow_runs DROP CONSTRAINT IF EXISTS workflow_runs_region_check;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_region_check
    CHECK (classification NOT IN ('sensitive', 'regulated') OR region IS NOT NULL);
CREATE INDEX IF NOT EXISTS workflow_runs_purge_class_idx
    ON workflow_runs (classification, finished_at)
    WHERE status IN ('completed', 'failed', 'cancelled');

CREATE OR REPLACE FUNCTION phasegate_residency_fixed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.classification IS DISTINCT FROM OLD.classification
       OR NEW.region IS DISTINCT FROM OLD.region THEN
        RAISE EXCEPTION 'phasegate: the classification and region of run % are fixed at start',
            OLD.workflow_id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
-- "UPDATE OF" columns: fires only for statements that SET them, so the phase commit (which
-- never does) pays nothing.
DROP TRIGGER IF EXISTS workflow_runs_residency_fixed ON workflow_runs;
CREATE TRIGGER workflow_runs_residency_fixed
    BEFORE UPDATE OF classification, region ON workflow_runs
    FOR EACH ROW EXECUTE FUNCTION phasegate_residency_fixed();

-- Every read of checkpoint state through the API/CLI, and every denial. Append-only: no
-- foreign key (the log outlives purged runs), UPDATE/DELETE/TRUNCATE refused by triggers.
CREATE TABLE IF NOT EXISTS access_log (
    access_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    workflow_id text NOT NULL,
    workflow    text,
    phase       text,
    seq         integer,
    branch      text,
    role        text,
    decision    text NOT NULL CHECK (decision IN ('read', 'denied')),
    resource    text NOT NULL,
    reason      text,
    actor       text,
    db_user     text NOT NULL DEFAULT current_user
);
CREATE INDEX IF NOT EXISTS access_log_run_idx ON access_log (workflow_id, access_id);
CREATE INDEX IF NOT EXISTS access_log_at_idx ON access_log (at);

CREATE OR REPLACE FUNCTION phasegate_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'phasegate: % is append-only (% refused)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
DROP TRIGGER IF EXISTS access_log_append_only ON access_log;
CREATE TRIGGER access_log_append_only BEFORE UPDATE OR DELETE ON access_log
    FOR EACH ROW EXECUTE FUNCTION phasegate_append_only();
DROP TRIGGER IF EXISTS access_log_no_truncate ON access_log;
CREATE TRIGGER access_log_no_truncate BEFORE TRUNCATE ON access_log
    FOR EACH STATEMENT EXECUTE FUNCTION phasegate_append_only();

-- Group roles (cluster-wide, NOLOGIN): the operator grants them to login users, e.g.
-- `CREATE ROLE worker_pod LOGIN PASSWORD '...' IN ROLE phasegate_worker`.
DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['phasegate_worker', 'phasegate_reader', 'phasegate_auditor'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = name) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', name);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database's migration created it a moment ago
            END;
        END IF;
    END LOOP;
END $$;

GRANT USAGE ON SCHEMA public TO phasegate_worker, phasegate_reader, phasegate_auditor;

-- The worker (and relay): the DML the engine runs, nothing else. No DDL (no CREATE on the
-- schema is granted), no DELETE, nothing on the access log.
GRANT SELECT ON phasegate_migrations TO phasegate_worker;
GRANT SELECT, INSERT, UPDATE ON workflow_runs, outbox, step_records TO phasegate_worker;
GRANT SELECT, INSERT ON checkpoints, deliveries TO phasegate_worker;
GRANT INSERT ON quarantine TO phasegate_worker;
GRANT SELECT ON control_actions TO phasegate_worker;
DO $$
BEGIN
    -- Tables of other migrations the engine writes, when present.
    IF to_regclass('public.branches') IS NOT NULL THEN
        GRANT SELECT, INSERT, UPDATE ON branches TO phasegate_worker;
    END IF;
END $$;

-- The reader: run and checkpoint metadata, never state, input, outputs or the error text.
GRANT SELECT (workflow_id, workflow, status, next_seq, base_seq, epoch, current_phase,
              schema_version, tier, tier_label, classification, region, attempts,
              created_at, updated_at, finished_at) ON workflow_runs TO phasegate_reader;
GRANT SELECT (checkpoint_id, workflow_id, branch, seq, phase, kind, schema_version,
              state_hash, tier, tier_label, outcome, rerun_of, worker_id, trace_id,
              created_at) ON checkpoints TO phasegate_reader;
GRANT SELECT (action_id, workflow_id, action, from_status, seq, epoch, actor, created_at)
    ON control_actions TO phasegate_reader;

-- The auditor: the access log, and nothing else.
GRANT SELECT ON access_log TO phasegate_auditor;
