-- phasegate schema v26: a phase checkpoint is written into two indexes, not three. Re-running
-- any statement here is harmless.
--
-- checkpoints_history_idx (workflow_id, checkpoint_id), from 0003, served a run's history in
-- commit order and the purge's deletes. Every phase commit paid for an entry in it beside the
-- primary key and checkpoints_phase_key (workflow_id, branch, seq) WHERE kind = 'phase': about
-- a tenth of a continued hop's WAL (`python -m bench.statement_costs --only schemas`, see
-- docs/benchmarks.md). A run's phase checkpoints are all in checkpoints_phase_key already,
-- under the same leading workflow_id; the rare kinds (emergency, discarded) keep a history
-- index of their own, which a phase commit never writes.
--
-- Every reader of a run's checkpoints of any kind now names the kind: the history, the purge
-- and its count (sql/control.sql), the branch tree (sql/branches.sql) and the trigger that
-- deletes a deleted run's checkpoints (0025, replaced below) read the phase rows and the others
-- apart. Building the new index reads the whole table, and writes to checkpoints wait
-- meanwhile: on a large table, migrate in a quiet hour.
CREATE INDEX IF NOT EXISTS checkpoints_rare_history_idx
    ON checkpoints (workflow_id, checkpoint_id) WHERE kind <> 'phase';

DROP INDEX IF EXISTS checkpoints_history_idx;

CREATE OR REPLACE FUNCTION phasegate_drop_checkpoints() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $fn$
BEGIN
    DELETE FROM checkpoints c USING gone g
     WHERE c.workflow_id = g.workflow_id AND c.kind = 'phase';
    DELETE FROM checkpoints c USING gone g
     WHERE c.workflow_id = g.workflow_id AND c.kind <> 'phase';
    RETURN NULL;
END $fn$;
