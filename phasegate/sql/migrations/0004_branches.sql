-- phasegate schema v4: branches. A phase forks N branches (ctx.fork); each runs its own
-- checkpoint chain (checkpoints.branch) in its own SQS message group (workflow_id/branch);
-- the merge phase runs once on the parent chain when the fork is resolved (every branch
-- done, a race won, or a supervisor merge). Additive: v3 workers keep working against it.

-- One row per fork: how it resolves, and the counter the fan-in decision serialises on.
-- Every commit that can resolve a fork (a branch's final commit, a supervisor merge) first
-- locks this row (SELECT ... FOR UPDATE), so they run one after another and each sees what
-- the previous one did: exactly one of them resolves it.
CREATE TABLE forks (
    workflow_id   text NOT NULL REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    parent_branch text NOT NULL DEFAULT 'main',
    -- the parent's seq whose commit forked; the merge phase runs at fork_seq + 1.
    fork_seq      integer NOT NULL,
    mode          text NOT NULL CHECK (mode IN ('all', 'race')),
    merge_phase   text NOT NULL,
    -- the phase after the merge phase (NULL: the merge phase is the last); a supervisor
    -- merge continues the parent chain there without needing the workflow's code.
    after_merge   text,
    -- race mode: a branch whose committed tier reaches this number wins before it finishes.
    win_tier      integer,
    branch_count  integer NOT NULL CHECK (branch_count >= 1),
    -- branches not yet finished ('all' mode): the commit that takes it to 0 fans in.
    pending       integer NOT NULL CHECK (pending >= 0),
    status        text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'merged')),
    -- fan_in (all branches done), race (first to finish won), supervisor (operator chose).
    resolution    text CHECK (resolution IN ('fan_in', 'race', 'supervisor')),
    winner        text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    resolved_at   timestamptz,
    PRIMARY KEY (workflow_id, parent_branch, fork_seq)
);

-- One row per branch: its position (next_seq, like workflow_runs.next_seq for main), its
-- status and a reference to its final state (the checkpoint at final_seq).
CREATE TABLE branches (
    workflow_id   text NOT NULL REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    branch        text NOT NULL,
    parent_branch text NOT NULL DEFAULT 'main',
    fork_seq      integer NOT NULL,
    -- order among its siblings (the order of ctx.fork's inputs; the merge sees this order).
    ordinal       integer NOT NULL,
    -- the branch's first seq is fork_seq + 1; its first phase starts from `input`.
    next_seq      integer NOT NULL,
    current_phase text,
    status        text NOT NULL DEFAULT 'running' CHECK (status IN (
                      'running', 'completed', 'discarded', 'merged', 'failed')),
    input         jsonb,
    final_seq     integer,
    tier          integer,
    tier_label    text,
    attempts      integer NOT NULL DEFAULT 0,
    error         text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    PRIMARY KEY (workflow_id, branch),
    FOREIGN KEY (workflow_id, parent_branch, fork_seq)
        REFERENCES forks (workflow_id, parent_branch, fork_seq) ON DELETE CASCADE
);
CREATE INDEX branches_fork_idx ON branches (workflow_id, parent_branch, fork_seq, ordinal);

-- A branch phase whose commit was refused because its branch lost a race (or a supervisor
-- merge chose another branch) is recorded as a 'discarded' checkpoint: it happened, it was
-- never part of any chain, and it is never merged.
ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_kind_check;
ALTER TABLE checkpoints ADD CONSTRAINT checkpoints_kind_check
    CHECK (kind IN ('phase', 'emergency', 'discarded'));
-- A checkpoint on the parent chain written by a supervisor merge: the branch whose final
-- state it promoted.
ALTER TABLE checkpoints ADD COLUMN source_branch text;

ALTER TABLE control_actions DROP CONSTRAINT control_actions_action_check;
ALTER TABLE control_actions ADD CONSTRAINT control_actions_action_check
    CHECK (action IN ('cancel', 'retry', 'restart', 'approve', 'reject', 'merge'));
