-- phasegate schema v17: the hot position. A plain phase commit updates its run row HOT.
-- Re-running any statement here is harmless (idempotent).
--
-- PostgreSQL 15 writes an update beside the old row version on the same page, with no new
-- index entry and a small WAL record (a HOT update), only when the page has room and no column
-- named by any index of the table changes value: key, INCLUDE, expression and partial-index
-- predicate columns alike. A plain commit changes next_seq, current_phase, tier, tier_label and
-- updated_at (`python -m bench.lean_commit` lists them), and two indexes named some of them,
-- so every commit wrote a new entry into each index of the table (0 HOT updates, 3.4 KB of WAL
-- per commit):
--   workflow_runs_stall_idx          (updated_at) INCLUDE (..., current_phase, tier, tier_label)
--   workflow_runs_phase_created_idx  (current_phase, created_at, workflow_id)
-- Both go. What the stall index served (the stall report, the relay's stalled-run check, the
-- status summary) reads run_positions instead: one narrow row per run that has not ended,
-- equal to the position of its run row, kept so by the triggers below in the statement that
-- writes the run, whoever writes it (engine, control plane, admissions, an operator's SQL).
-- Its only index is its primary key, which never changes, so its updates are HOT too, and
-- those readers scan it whole: dozens of narrow rows per page instead of wide run rows spread
-- over the whole table. A phase filter on the run list walks the list's keyset indexes.
--
-- Locks: ACCESS EXCLUSIVE on workflow_runs from the first statement to the end of the
-- migration's transaction (DROP INDEX needs it; taking it first avoids a lock upgrade), so
-- reads and writes of runs wait for the backfill of the unfinished runs (milliseconds per
-- thousand). No table is rewritten: the fillfactor applies to pages written from now on, so
-- on a populated database a run's first update after the migration may still move its row to
-- a page with room; the updates after it are HOT.
LOCK TABLE workflow_runs IN ACCESS EXCLUSIVE MODE;

DROP INDEX IF EXISTS workflow_runs_stall_idx;
DROP INDEX IF EXISTS workflow_runs_phase_created_idx;
-- Room on each page for the next version of its rows: a HOT update stays on its page.
ALTER TABLE workflow_runs SET (fillfactor = 70);

CREATE TABLE IF NOT EXISTS run_positions (
    workflow_id   text PRIMARY KEY REFERENCES workflow_runs (workflow_id) ON DELETE CASCADE,
    workflow      text NOT NULL,
    status        text NOT NULL,
    next_seq      integer NOT NULL,
    current_phase text,
    tier          integer,
    tier_label    text,
    updated_at    timestamptz NOT NULL
) WITH (fillfactor = 80);

-- SECURITY DEFINER: the triggers write the position for whichever role writes the run, and no
-- role is granted writes on run_positions itself, so nothing else can make the two disagree.
-- Table names are schema-qualified (pg_catalog is searched first for everything else, and
-- only the schema owner creates objects in public).
CREATE OR REPLACE FUNCTION phasegate_track_position() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF NEW.status IN ('completed', 'failed', 'cancelled') THEN
        IF TG_OP = 'UPDATE' THEN
            DELETE FROM public.run_positions WHERE workflow_id = NEW.workflow_id;
        END IF;
        RETURN NULL;
    END IF;
    UPDATE public.run_positions
       SET workflow = NEW.workflow, status = NEW.status, next_seq = NEW.next_seq,
           current_phase = NEW.current_phase, tier = NEW.tier, tier_label = NEW.tier_label,
           updated_at = NEW.updated_at
     WHERE workflow_id = NEW.workflow_id;
    IF NOT FOUND THEN
        INSERT INTO public.run_positions (workflow_id, workflow, status, next_seq,
                                          current_phase, tier, tier_label, updated_at)
        VALUES (NEW.workflow_id, NEW.workflow, NEW.status, NEW.next_seq, NEW.current_phase,
                NEW.tier, NEW.tier_label, NEW.updated_at);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS workflow_runs_position_insert ON workflow_runs;
CREATE TRIGGER workflow_runs_position_insert AFTER INSERT ON workflow_runs
    FOR EACH ROW EXECUTE FUNCTION phasegate_track_position();
-- Only updates that move something the position holds (a review or an error alone do not).
DROP TRIGGER IF EXISTS workflow_runs_position_update ON workflow_runs;
CREATE TRIGGER workflow_runs_position_update AFTER UPDATE ON workflow_runs
    FOR EACH ROW
    WHEN ((OLD.workflow, OLD.status, OLD.next_seq, OLD.current_phase, OLD.tier,
           OLD.tier_label, OLD.updated_at)
          IS DISTINCT FROM (NEW.workflow, NEW.status, NEW.next_seq, NEW.current_phase,
                            NEW.tier, NEW.tier_label, NEW.updated_at))
    EXECUTE FUNCTION phasegate_track_position();

-- The runs that have not ended, as they stand (a re-run refreshes them).
INSERT INTO run_positions (workflow_id, workflow, status, next_seq, current_phase, tier,
                           tier_label, updated_at)
SELECT workflow_id, workflow, status, next_seq, current_phase, tier, tier_label, updated_at
  FROM workflow_runs
 WHERE status NOT IN ('completed', 'failed', 'cancelled')
ON CONFLICT (workflow_id) DO UPDATE
   SET workflow = excluded.workflow, status = excluded.status, next_seq = excluded.next_seq,
       current_phase = excluded.current_phase, tier = excluded.tier,
       tier_label = excluded.tier_label, updated_at = excluded.updated_at;
DELETE FROM run_positions p USING workflow_runs r
 WHERE r.workflow_id = p.workflow_id AND r.status IN ('completed', 'failed', 'cancelled');

DO $$
BEGIN
    -- Reads only: the stall report and the summary (orchestrator), the relay's stalled-run
    -- check (orchestrator, or `phasegate relay` run with the worker's role), operators.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_orchestrator') THEN
        GRANT SELECT ON run_positions TO phasegate_orchestrator;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'phasegate_worker') THEN
        GRANT SELECT ON run_positions TO phasegate_worker, phasegate_reader;
    END IF;
END $$;
