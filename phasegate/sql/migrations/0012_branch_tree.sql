-- phasegate schema v12: the branch tree. Branches fork again (a fork's parent_branch is a
-- branch), a branch that fails no longer fails its run unless its fork says so, and the
-- merge phase can review its branches (accept, discard, retry). Additive: the defaults keep
-- what a fork written by an older worker means (strict, no retries, merge at fork_seq + 1).

-- require_all: one failed branch fails the run (the behaviour of v4 forks, and of
-- ctx.fork(..., require="all")); false: the failure is recorded and the fork goes on.
ALTER TABLE forks ADD COLUMN require_all boolean NOT NULL DEFAULT true;
-- The review budget: how many branch retries the merge phase may still ask for, and used.
ALTER TABLE forks ADD COLUMN max_retries integer NOT NULL DEFAULT 0 CHECK (max_retries >= 0);
ALTER TABLE forks ADD COLUMN retries integer NOT NULL DEFAULT 0 CHECK (retries >= 0);
-- The parent chain's seq where the merge phase runs (NULL: fork_seq + 1). A review round that
-- retries branches checkpoints the merge phase and moves the merge one seq on.
ALTER TABLE forks ADD COLUMN merge_seq integer;
-- 'failed': every branch of a race failed (or, require_all, one did).
ALTER TABLE forks DROP CONSTRAINT forks_status_check;
ALTER TABLE forks ADD CONSTRAINT forks_status_check
    CHECK (status IN ('open', 'merged', 'failed'));
ALTER TABLE forks DROP CONSTRAINT forks_resolution_check;
ALTER TABLE forks ADD CONSTRAINT forks_resolution_check
    CHECK (resolution IN ('fan_in', 'race', 'supervisor', 'failed'));

-- depth: 1 for a fork of the main chain, parent's depth + 1 below it.
ALTER TABLE branches ADD COLUMN depth integer NOT NULL DEFAULT 1 CHECK (depth >= 1);
-- The seq where the branch's current attempt started from `input` (NULL: fork_seq + 1); a
-- review retry starts a new attempt one seq after the last one, so no step record of the
-- old attempt is replayed in the new one.
ALTER TABLE branches ADD COLUMN base_seq integer;
-- How many times a review sent this branch round again.
ALTER TABLE branches ADD COLUMN retries integer NOT NULL DEFAULT 0;

-- The live-branch bound (PHASEGATE_BRANCH_MAX_LIVE) counts these at every fork.
CREATE INDEX branches_live_idx ON branches (workflow_id) WHERE status = 'running';

DO $$
BEGIN
    -- A nested fork is written by the engine: the worker role locks and writes fork rows.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        GRANT SELECT, INSERT, UPDATE ON forks TO phasegate_worker;
    END IF;
END $$;
