-- phasegate schema v22: the rules on a run row and a checkpoint row cost each commit less.
-- Re-running any statement here is harmless.
--
-- PostgreSQL rebuilds a table's CHECK constraints and its triggers' WHEN clauses from their
-- stored text (stringToNode) in every statement that writes the table, whatever columns the
-- statement changes. A commit writes a run row (seven CHECKs, two of them IN lists stored as
-- arrays spelled out byte by byte, and the position trigger's seven-column comparison) and a
-- checkpoint (two IN lists): 16 µs of a continued hop's 79 µs inside the server, 13 of the
-- general commit's 116 (`python -m bench.statement_costs`). The same rules, stated so that
-- each statement only reads a function call:
--
-- - the CHECKs of each table become one CHECK calling an IMMUTABLE PL/pgSQL function (its body
--   is planned once per server connection), which raises a check_violation naming the rule a
--   row breaks, and no longer echoes the whole row (the run's input) into the error;
-- - the position trigger (0017, 0018) fires unless the commit's own flag is on, and its
--   function returns at once when nothing the position holds moved (the comparison that was
--   its WHEN clause);
-- - the slot trigger (0011) keeps its test on the concurrency key in its WHEN clause, so a run
--   without one never fires it, and asks a function about the status change.
--
-- A later migration that widens a list (a new status) replaces the function: rows that met the
-- narrower rule meet the wider one. Each new CHECK is added NOT VALID: the rows already there
-- met the CHECKs it replaces (validated when those were added), and a migration runs in one
-- transaction, so validating would read every run and checkpoint under the lock the ALTERs
-- take. A NOT VALID CHECK is enforced on every insert and update all the same.
CREATE OR REPLACE FUNCTION phasegate_run_row_valid(
    p_status text, p_next_seq integer, p_classification text, p_region text,
    p_concurrency_limit integer, p_rate_limit integer, p_rate_window_s float8)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_status NOT IN ('pending', 'running', 'awaiting_review', 'completed', 'failed',
                        'cancelled', 'needs_restart', 'waiting', 'queued') THEN
        RAISE EXCEPTION 'phasegate: "%" is not a run status', left(p_status, 40)
            USING ERRCODE = 'check_violation';
    END IF;
    IF p_next_seq < 0 THEN
        RAISE EXCEPTION 'phasegate: a run''s next_seq is never below 0'
            USING ERRCODE = 'check_violation';
    END IF;
    IF p_classification NOT IN ('public', 'internal', 'sensitive', 'regulated') THEN
        RAISE EXCEPTION 'phasegate: "%" is not a classification', left(p_classification, 40)
            USING ERRCODE = 'check_violation';
    END IF;
    IF p_classification IN ('sensitive', 'regulated') AND p_region IS NULL THEN
        RAISE EXCEPTION 'phasegate: a % run needs a region', p_classification
            USING ERRCODE = 'check_violation';
    END IF;
    IF p_concurrency_limit < 1 OR p_rate_limit < 1 OR p_rate_window_s <= 0 THEN
        RAISE EXCEPTION 'phasegate: a concurrency limit, rate limit and rate window are '
                        'above 0' USING ERRCODE = 'check_violation';
    END IF;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION phasegate_checkpoint_row_valid(p_kind text, p_outcome text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_kind NOT IN ('phase', 'emergency', 'discarded') THEN
        RAISE EXCEPTION 'phasegate: "%" is not a checkpoint kind', left(p_kind, 40)
            USING ERRCODE = 'check_violation';
    END IF;
    IF p_outcome NOT IN ('retry', 'review') THEN
        RAISE EXCEPTION 'phasegate: "%" is not a checkpoint outcome', left(p_outcome, 40)
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN true;
END $$;

ALTER TABLE workflow_runs DROP CONSTRAINT IF EXISTS workflow_runs_row_valid;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_row_valid CHECK (phasegate_run_row_valid(
    status, next_seq, classification, region, concurrency_limit, rate_limit, rate_window_s))
    NOT VALID;
ALTER TABLE workflow_runs DROP CONSTRAINT IF EXISTS workflow_runs_status_check,
    DROP CONSTRAINT IF EXISTS workflow_runs_next_seq_check,
    DROP CONSTRAINT IF EXISTS workflow_runs_classification_check,
    DROP CONSTRAINT IF EXISTS workflow_runs_region_check,
    DROP CONSTRAINT IF EXISTS workflow_runs_concurrency_limit_check,
    DROP CONSTRAINT IF EXISTS workflow_runs_rate_limit_check,
    DROP CONSTRAINT IF EXISTS workflow_runs_rate_window_s_check;

ALTER TABLE checkpoints DROP CONSTRAINT IF EXISTS checkpoints_row_valid;
ALTER TABLE checkpoints ADD CONSTRAINT checkpoints_row_valid
    CHECK (phasegate_checkpoint_row_valid(kind, outcome)) NOT VALID;
ALTER TABLE checkpoints DROP CONSTRAINT IF EXISTS checkpoints_kind_check,
    DROP CONSTRAINT IF EXISTS checkpoints_outcome_check;

-- The position trigger: 0020's function, which now compares what its WHEN clause compared
-- (and keeps the position's updated_at from going back: 0023).
CREATE OR REPLACE FUNCTION phasegate_track_position() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND (OLD.workflow, OLD.status, OLD.next_seq, OLD.current_phase, OLD.tier,
            OLD.tier_label, OLD.updated_at)
           IS NOT DISTINCT FROM (NEW.workflow, NEW.status, NEW.next_seq, NEW.current_phase,
                                 NEW.tier, NEW.tier_label, NEW.updated_at) THEN
        RETURN NULL;  -- nothing the position holds moved (a review or an error alone)
    END IF;
    IF NEW.status IN ('completed', 'failed', 'cancelled') THEN
        IF TG_OP = 'UPDATE' THEN
            DELETE FROM public.run_positions WHERE workflow_id = NEW.workflow_id;
        END IF;
        RETURN NULL;
    END IF;
    -- The position's updated_at never goes back: a plain commit moves only the position's
    -- (0023), so a writer that leaves the run row's as it was must not undo that.
    UPDATE public.run_positions p
       SET workflow = NEW.workflow, status = NEW.status, next_seq = NEW.next_seq,
           current_phase = NEW.current_phase, tier = NEW.tier, tier_label = NEW.tier_label,
           updated_at = greatest(p.updated_at, NEW.updated_at),
           chain_holder = CASE WHEN p.next_seq = NEW.next_seq AND NEW.status = 'running'
                               THEN p.chain_holder END,
           chain_until = CASE WHEN p.next_seq = NEW.next_seq AND NEW.status = 'running'
                              THEN p.chain_until END,
           chain_traceparent = CASE WHEN p.next_seq = NEW.next_seq AND NEW.status = 'running'
                                    THEN p.chain_traceparent END
     WHERE workflow_id = NEW.workflow_id;
    IF NOT FOUND THEN
        INSERT INTO public.run_positions (workflow_id, workflow, status, next_seq,
                                          current_phase, tier, tier_label, updated_at)
        VALUES (NEW.workflow_id, NEW.workflow, NEW.status, NEW.next_seq, NEW.current_phase,
                NEW.tier, NEW.tier_label, NEW.updated_at);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS workflow_runs_position_update ON workflow_runs;
CREATE TRIGGER workflow_runs_position_update AFTER UPDATE ON workflow_runs
    FOR EACH ROW
    WHEN (current_setting('phasegate.own_position', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION phasegate_track_position();

-- The slot trigger (0011): a run that held a slot and has just ended frees it.
CREATE OR REPLACE FUNCTION phasegate_frees_slot(p_old_status text, p_new_status text)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN p_old_status NOT IN ('queued', 'completed', 'failed', 'cancelled')
           AND p_new_status IN ('completed', 'failed', 'cancelled');
END $$;

DROP TRIGGER IF EXISTS workflow_runs_free_slot ON workflow_runs;
CREATE TRIGGER workflow_runs_free_slot AFTER UPDATE OF status ON workflow_runs
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND phasegate_frees_slot(OLD.status, NEW.status))
    EXECUTE FUNCTION phasegate_free_slot();
