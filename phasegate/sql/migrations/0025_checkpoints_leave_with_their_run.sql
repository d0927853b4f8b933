-- phasegate schema v25: a checkpoint no longer checks a foreign key when it is written; its run
-- takes it along when the run is deleted, by a statement trigger. Re-running any statement here
-- is harmless.
--
-- checkpoints.workflow_id referenced workflow_runs (0001, ON DELETE CASCADE). Every checkpoint
-- INSERT then ran the foreign key's check: an SPI query that takes a key-share lock on the run
-- row, and a Heap/LOCK record in the WAL, once per phase. On the hot path that lock is always
-- redundant: every commit function writes its checkpoint from the run row it has just updated
-- (so it already holds a stronger lock on it), and a branch's commit from the branch row it has
-- just updated (branches reference the run and go with it, so deleting the run waits for that
-- row). Measured without it (`python -m bench.statement_costs --only schemas`): see
-- docs/benchmarks.md.
--
-- What the foreign key guaranteed, and what guarantees it now:
-- - A checkpoint never outlives its run. Deleting runs (the purge, an operator's DELETE) fires
--   phasegate_drop_checkpoints once per statement, which deletes the deleted runs' checkpoints
--   with a snapshot taken after the run rows were deleted (a VOLATILE function's statements
--   each take their own): a checkpoint committed while the DELETE waited for a run row's lock
--   goes too, as the cascade's did.
-- - No checkpoint is written for a run being deleted. Every statement that writes one locks the
--   run row, or a branch row, first: the commit functions and the branch commits update it;
--   the emergency checkpoint (sql/queries.sql) and a discarded branch's checkpoint
--   (sql/branches.sql) read it FOR KEY SHARE. A DELETE of the run waits for them, and a writer
--   that comes after it finds no row and writes nothing.
CREATE OR REPLACE FUNCTION phasegate_drop_checkpoints() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
BEGIN
    DELETE FROM checkpoints c USING gone g WHERE c.workflow_id = g.workflow_id;
    RETURN NULL;
END $fn$;
REVOKE ALL ON FUNCTION phasegate_drop_checkpoints() FROM PUBLIC;

DROP TRIGGER IF EXISTS workflow_runs_drop_checkpoints ON workflow_runs;
CREATE TRIGGER workflow_runs_drop_checkpoints
    AFTER DELETE ON workflow_runs REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION phasegate_drop_checkpoints();

ALTER TABLE checkpoints DROP CONSTRAINT IF EXISTS checkpoints_workflow_id_fkey;
