-- phasegate schema v16: race deadlines and the doors of branches. Additive: a fork written
-- before it has no deadline, a branch written before it is never 'stale'.

-- A race's deadline, in database time: the forking statement's now() + ctx.fork(deadline_s=).
-- NULL: no deadline (and a review round that reopens the fork clears it). The same statement
-- writes a 'deadline' message due at this moment; the relay sends it when due, and the worker
-- that receives it ends the race under this row's lock unless a branch won first.
ALTER TABLE forks ADD COLUMN IF NOT EXISTS deadline_at timestamptz;
-- 'deadline': the race had no winner when its deadline passed (status 'failed').
ALTER TABLE forks DROP CONSTRAINT IF EXISTS forks_resolution_check;
ALTER TABLE forks ADD CONSTRAINT forks_resolution_check
    CHECK (resolution IN ('fan_in', 'race', 'supervisor', 'failed', 'deadline'));

-- 'stale': the branch's staleness check found an observed resource changed (or unknown); the
-- branch stopped with the reason in `error` and its fork counted it like a failed branch.
ALTER TABLE branches DROP CONSTRAINT IF EXISTS branches_status_check;
ALTER TABLE branches ADD CONSTRAINT branches_status_check CHECK (status IN (
    'running', 'completed', 'discarded', 'merged', 'failed', 'stale'));
