-- phasegate schema v2: inside the room. Step records (replay-safe steps with idempotency
-- keys), the delivery receipt ledger, and what progress tiers, reviews and re-runs need on
-- checkpoints and runs. Every change is additive: a database at v1 with runs in flight
-- migrates in place, and v1 workers keep working against it.

-- One row per step of a phase attempt. A write/execute step commits `pre_execution` BEFORE
-- its function runs and `completed` (with its output) after; a replayed phase returns the
-- recorded output of completed steps and calls pre_execution steps again with the same key.
-- Rows of a seq whose phase checkpoint exists are history.
CREATE TABLE step_records (
    workflow_id     text NOT NULL REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    branch          text NOT NULL DEFAULT 'main',
    seq             integer NOT NULL,
    step_seq        integer NOT NULL CHECK (step_seq >= 1),
    step_name       text NOT NULL,
    category        text NOT NULL CHECK (category IN ('read', 'write', 'execute')),
    -- first 32 hex chars of sha256('workflow_id:branch:seq:step_seq'): what the downstream
    -- deduplicates on.
    idempotency_key text NOT NULL,
    -- sha256 of the step's arguments as JSON: a replay with other arguments is logged.
    input_hash      text NOT NULL,
    status          text NOT NULL CHECK (status IN ('pre_execution', 'completed')),
    output          jsonb,
    worker_id       text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    PRIMARY KEY (workflow_id, branch, seq, step_seq),
    CHECK ((status = 'completed') = (completed_at IS NOT NULL))
);

-- The receipt ledger: one row per delivered artifact, for the whole run (not per phase), so
-- a resumed or re-run phase skips what was already delivered. artifact_id '' is reserved: it
-- marks the batch itself as processed (ctx.batch_done), which ctx.pending reads.
CREATE TABLE deliveries (
    workflow_id     text NOT NULL REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    batch_id        text NOT NULL,
    artifact_id     text NOT NULL,
    idempotency_key text NOT NULL,
    seq             integer NOT NULL,
    receipt         jsonb,
    worker_id       text,
    delivered_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, batch_id, artifact_id)
);

-- How a phase attempt ended when it did not simply advance: 'retry' (below its expected tier,
-- run again from the same input) or 'review' (below tier, escalated to awaiting_review).
-- rerun_of: for a re-run (tier retry, or a rejected review), the seq of the phase's FIRST
-- attempt; the re-run starts from that attempt's input and counts its attempts from it.
ALTER TABLE checkpoints
    ADD COLUMN outcome text CHECK (outcome IN ('retry', 'review')),
    ADD COLUMN rerun_of integer;
CREATE INDEX checkpoints_rerun_idx ON checkpoints (workflow_id, branch, rerun_of)
    WHERE rerun_of IS NOT NULL;

-- The last review a run was sent to, and why: {"kind": "stale" | "below_tier", "seq", "phase",
-- ...}. `error` holds the same reason as one line of text.
ALTER TABLE workflow_runs ADD COLUMN review jsonb;
