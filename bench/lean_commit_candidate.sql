-- phasegate schema v9: a lean phase commit.
--
-- Every phase commit updates its run row (next_seq, current_phase, tier, updated_at, ...).
-- PostgreSQL can write that update beside the old version on the same page, with no new index
-- entries and a small WAL record (a HOT update), only when no indexed column changes: a key
-- column, an INCLUDE column or a column of a partial index's predicate alike (PostgreSQL 15
-- counts them all). Measured before this migration (bench/transitions.py): every commit was
-- a non-HOT update writing an entry into each of the table's 11 indexes, ~4.3 KB of WAL per
-- transition. So no index on workflow_runs names a column that changes on every commit:
--   updated_at     workflow_runs_unfinished_idx, workflow_runs_stall_idx  -> dropped
--   current_phase  workflow_runs_phase_created_idx, workflow_runs_stall_idx -> dropped
--   tier, tier_label  (INCLUDE columns of workflow_runs_stall_idx)         -> dropped
-- What remains is keyed on columns written at start (workflow_id, workflow, created_at,
-- classification) or at the run's few status changes (status, finished_at). The reads that
-- used the dropped indexes go through the unfinished runs instead, a few percent of the table
-- (workflow_runs_unfinished_created_idx, keyed on created_at, predicate on status only):
-- stalls, requeue_stalled, the summary; a phase filter on the run list walks the list's own
-- keyset index and reads current_phase from the row. bench/queries.py keeps each read under
-- its 5 ms p50 on 100k runs.
DROP INDEX IF EXISTS workflow_runs_unfinished_idx;
DROP INDEX IF EXISTS workflow_runs_stall_idx;
DROP INDEX IF EXISTS workflow_runs_phase_created_idx;

-- Room on each page for the next version of its rows: a HOT update needs free space on the
-- same page (new pages only; existing ones are pruned as they are updated).
ALTER TABLE workflow_runs SET (fillfactor = 70);

-- The residency rule (0005) as a statement trigger. A BEFORE UPDATE row trigger, even one
-- limited to `UPDATE OF classification, region`, makes PostgreSQL fetch and lock the old row
-- before it looks at the column list: an extra tuple lock and WAL record on every commit. No
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
