-- phasegate schema v1: runs, the append-only checkpoint chain, the outbox, the quarantine.

CREATE TABLE workflow_runs (
    workflow_id     text PRIMARY KEY,
    workflow        text NOT NULL,
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN (
                        'pending', 'running', 'awaiting_review', 'completed', 'failed',
                        'cancelled', 'needs_restart')),
    -- seq of the next phase message to run on the main branch; a commit moves it by one.
    next_seq        integer NOT NULL DEFAULT 0 CHECK (next_seq >= 0),
    current_phase   text,
    schema_version  integer NOT NULL,
    tier            integer,
    tier_label      text,
    classification  text NOT NULL DEFAULT 'internal',
    region          text,
    retention       interval,
    input           jsonb,
    -- failed attempts of the current phase; reset by every commit.
    attempts        integer NOT NULL DEFAULT 0,
    -- bumped by retry/restart so the resuming message escapes SQS's dedup window.
    epoch           integer NOT NULL DEFAULT 0,
    -- the seq whose phase starts from `input` (0, or where a restart began again).
    base_seq        integer NOT NULL DEFAULT 0,
    error           text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX workflow_runs_status_idx ON workflow_runs (status, workflow_id);
CREATE INDEX workflow_runs_unfinished_idx ON workflow_runs (updated_at)
    WHERE status IN ('pending', 'running', 'awaiting_review');

CREATE TABLE checkpoints (
    checkpoint_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id       text NOT NULL REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    branch            text NOT NULL DEFAULT 'main',
    seq               integer NOT NULL,
    phase             text NOT NULL,
    kind              text NOT NULL CHECK (kind IN ('phase', 'emergency')),
    schema_version    integer NOT NULL,
    state             jsonb NOT NULL,
    state_hash        text NOT NULL,
    tier              integer,
    tier_label        text,
    resource_versions jsonb,
    worker_id         text,
    trace_id          text,
    created_at        timestamptz NOT NULL DEFAULT now()
);
-- The key of the chain: exactly one phase checkpoint per (workflow, branch, seq).
-- Emergency checkpoints (in-phase progress) may repeat and never take a seq of their own.
CREATE UNIQUE INDEX checkpoints_phase_key
    ON checkpoints (workflow_id, branch, seq) WHERE kind = 'phase';
CREATE INDEX checkpoints_emergency_idx
    ON checkpoints (workflow_id, branch, seq, checkpoint_id) WHERE kind = 'emergency';

CREATE TABLE outbox (
    outbox_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id  text NOT NULL REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    branch       text NOT NULL DEFAULT 'main',
    seq          integer NOT NULL,
    dedup_id     text NOT NULL UNIQUE,
    group_id     text NOT NULL,
    body         text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    sent_at      timestamptz
);
CREATE INDEX outbox_unsent_idx ON outbox (created_at) WHERE sent_at IS NULL;
CREATE INDEX outbox_successor_idx ON outbox (workflow_id, branch, seq);

CREATE TABLE quarantine (
    quarantine_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    text NOT NULL,
    workflow_id   text,
    reason        text NOT NULL,
    body_bytes    integer NOT NULL,
    worker_id     text,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX quarantine_created_idx ON quarantine (created_at);
