-- phasegate control plane: the indexes behind the orchestrator's list/inspect/stall/purge
-- queries, and an append-only log of operator actions (cancel, retry, restart, approve,
-- reject) that also carries review decisions to the worker.

-- GET /v1/workflows: newest first, keyset on (created_at, workflow_id), optionally filtered.
CREATE INDEX workflow_runs_created_idx ON workflow_runs (created_at DESC, workflow_id DESC);
CREATE INDEX workflow_runs_status_created_idx
    ON workflow_runs (status, created_at DESC, workflow_id DESC);
CREATE INDEX workflow_runs_workflow_created_idx
    ON workflow_runs (workflow, created_at DESC, workflow_id DESC);
CREATE INDEX workflow_runs_phase_created_idx
    ON workflow_runs (current_phase, created_at DESC, workflow_id DESC);

-- GET /v1/stalls and the exporter's oldest-unfinished age: only unfinished runs, with the
-- grouping columns included so the report is an index-only scan.
CREATE INDEX workflow_runs_stall_idx
    ON workflow_runs (updated_at) INCLUDE (workflow, current_phase, tier, tier_label, status)
    WHERE status IN ('pending', 'running', 'awaiting_review');

-- The exporter's age of the oldest unfinished run.
CREATE INDEX workflow_runs_unfinished_created_idx ON workflow_runs (created_at)
    WHERE status IN ('pending', 'running', 'awaiting_review');

-- phasegate purge: finished runs by finish time.
CREATE INDEX workflow_runs_finished_idx ON workflow_runs (finished_at)
    WHERE status IN ('completed', 'failed', 'cancelled');

-- GET /v1/workflows/{id}/checkpoints (phase and emergency rows alike) and the cascade of
-- purge's deletes.
CREATE INDEX checkpoints_history_idx ON checkpoints (workflow_id, checkpoint_id);

CREATE TABLE control_actions (
    action_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id  text NOT NULL REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    action       text NOT NULL CHECK (action IN (
                     'cancel', 'retry', 'restart', 'approve', 'reject')),
    from_status  text NOT NULL,
    -- the run's next_seq when the action was taken: a review decision applies to this seq.
    seq          integer NOT NULL,
    epoch        integer NOT NULL,
    reason       text,
    actor        text,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX control_actions_run_idx ON control_actions (workflow_id, action_id);
