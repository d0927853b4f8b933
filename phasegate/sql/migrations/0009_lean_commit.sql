-- phasegate schema v9: a leaner phase commit (issue 18). Re-running any statement here is
-- harmless (idempotent).
--
-- Every phase commit updates its run row, and an update writes one entry into EVERY index of
-- the table unless it is HOT (PostgreSQL 15 writes a HOT update only when no indexed column
-- changes: key, INCLUDE and partial-index predicate columns alike). The commit changes
-- updated_at, current_phase, tier, tier_label and next_seq, so it is never HOT while
-- workflow_runs_stall_idx (updated_at, INCLUDE current_phase, tier, tier_label) exists -- and
-- that index is what keeps the stall report an index-only scan under 5 ms p50 on 100k runs
-- (bench/queries.py; without it the report read 8,000 rows from the heap: 3.2x slower, over
-- the bound). So this migration does not make the commit HOT; it removes what the commit pays
-- for nothing:
--
-- workflow_runs_unfinished_idx (updated_at) WHERE status IN (unfinished): the same key and
-- predicate as workflow_runs_stall_idx, which serves every query that used it (the relay's
-- requeue_stalled filters on a subset of the same statuses). One index entry per commit less.
DROP INDEX IF EXISTS workflow_runs_unfinished_idx;

-- The residency rule (0005) as a statement trigger. A BEFORE UPDATE row trigger, even one
-- limited to `UPDATE OF classification, region`, makes PostgreSQL fetch and lock the old row
-- before it looks at the column list: a tuple lock and its WAL record on every commit. No
-- statement of phasegate's sets those columns after the insert, so a statement that names
-- them is refused outright, whatever rows it would touch.
CREATE OR REPLACE FUNCTION phasegate_residency_fixed_statement() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'phasegate: the classification and region of a run are fixed at start'
        USING ERRCODE = 'integrity_constraint_violation';
END $$;
DROP TRIGGER IF EXISTS workflow_runs_residency_fixed ON workflow_runs;
DROP TRIGGER IF EXISTS workflow_runs_residency_fixed_statement ON workflow_runs;
CREATE TRIGGER workflow_runs_residency_fixed_statement
    BEFORE UPDATE OF classification, region ON workflow_runs
    FOR EACH STATEMENT EXECUTE FUNCTION phasegate_residency_fixed_statement();
