-- phasegate schema v35: a run admitted by the end of another run shows `pending` in its
-- position, whichever statement ended that run. Re-running any statement here is harmless.
--
-- run_positions follows the run row through workflow_runs_position_update (0017, 0031) for
-- every writer that does not write the position itself. phasegate_commit_phase and
-- phasegate_commit_phases write their own run's position, so they stand that trigger down for
-- their statement (phasegate.own_position, 0018). When such a commit ends a run of a keyed
-- workflow, the run's slot trigger (workflow_runs_free_slot) admits the next queued runs of its
-- key inside the same statement: their rows went from `queued` to `pending`, but the trigger
-- was down for them too, so their positions stayed `queued` until a worker claimed them.
-- requeue_stalled reads the positions: an admission message that SQS lost (or that never
-- arrived) left its run `pending` for good, never sent again. The chaos suite's keyed workload
-- found it (`python -m bench.chaos --seed 74 --workflows 120 --keyed 2 --continuation off`).
--
-- The slot trigger now lifts the stand-down around its admissions and puts it back after, so
-- the runs it admits are followed like any other write. The ending run's own position is not
-- touched by this: an AFTER ROW trigger's WHEN is decided when its row is written, before the
-- slot trigger runs.
--
-- Rolling upgrade: nothing to order. A function body replaced; no signature or grant changes.

CREATE OR REPLACE FUNCTION phasegate_free_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    owned boolean := current_setting('phasegate.own_position', true) = 'on';
    flag text;  -- an assignment is evaluated as a simple expression; PERFORM runs a query
BEGIN
    IF owned THEN
        flag := set_config('phasegate.own_position', 'off', true);
    END IF;
    PERFORM phasegate_admit(OLD.workflow, OLD.concurrency_key, NEW.concurrency_limit,
                            OLD.workflow_id, NEW.rate_limit, NEW.rate_window_s);
    IF owned THEN
        flag := set_config('phasegate.own_position', 'on', true);
    END IF;
    RETURN NULL;
END $$;

-- Runs admitted that way before this migration: their positions catch up now.
UPDATE run_positions p
   SET status = r.status, updated_at = greatest(p.updated_at, r.updated_at)
  FROM workflow_runs r
 WHERE r.workflow_id = p.workflow_id AND p.status = 'queued' AND r.status = 'pending';
