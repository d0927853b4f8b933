-- phasegate schema v29: the rules on a run row and a checkpoint row are checked only by a
-- write that can break them. Re-running any statement here is harmless.
--
-- Since 0022 each table has one CHECK calling a PL/pgSQL function. PostgreSQL evaluates every
-- CHECK of a table on every insert and update, whatever columns the statement writes, so
-- each commit called both functions although it writes none of the columns they test but
-- next_seq, which it moves from the value its own condition read to that value plus one. The
-- two calls were about 15 % of a continued hop's run-row update and 7 % of its checkpoint
-- insert inside the server; `python -m bench.statement_costs --only rows` compares v28 with
-- this schema statement by statement (docs/benchmarks.md).
--
-- The same rules, through the same functions with the same messages (a check_violation that
-- names the rule and never echoes the row), now run from AFTER ROW triggers that fire only
-- when the rule can break:
-- - a run row: on insert; on an update that changes its status; on any update that names
--   classification, region or a limit (rare: a run's start fixes the first two, 0005); on an
--   update that sets next_seq below 0. A commit that leaves its run running (a continued hop,
--   a plain advance) names none of these but next_seq, whose trigger condition is a single
--   comparison, so it calls no function; a commit that names status unchanged (group commit)
--   evaluates one comparison.
-- - a checkpoint: on an insert or an update of kind or outcome, unless the row is a plain
--   phase checkpoint with no outcome (kind 'phase', outcome NULL: every continued hop and
--   plain advance), which meets both rules.
--
-- An AFTER ROW trigger that raises fails its statement as the CHECK did: nothing the
-- statement wrote stays. The rows already there met the CHECKs (enforced on every write since
-- they were added), so nothing is re-read. A later migration widens a rule (a new status) by
-- replacing phasegate_run_row_valid or phasegate_checkpoint_row_valid, as before.

CREATE OR REPLACE FUNCTION phasegate_check_run_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.phasegate_run_row_valid(NEW.status, NEW.next_seq, NEW.classification,
                                           NEW.region, NEW.concurrency_limit, NEW.rate_limit,
                                           NEW.rate_window_s);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION phasegate_check_checkpoint_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM public.phasegate_checkpoint_row_valid(NEW.kind, NEW.outcome);
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS workflow_runs_rules_on_insert ON workflow_runs;
CREATE TRIGGER workflow_runs_rules_on_insert AFTER INSERT ON workflow_runs
    FOR EACH ROW EXECUTE FUNCTION phasegate_check_run_row();
DROP TRIGGER IF EXISTS workflow_runs_rules_on_status ON workflow_runs;
CREATE TRIGGER workflow_runs_rules_on_status AFTER UPDATE OF status ON workflow_runs
    FOR EACH ROW WHEN (NEW.status <> OLD.status)
    EXECUTE FUNCTION phasegate_check_run_row();
DROP TRIGGER IF EXISTS workflow_runs_rules_on_fixed ON workflow_runs;
CREATE TRIGGER workflow_runs_rules_on_fixed
    AFTER UPDATE OF classification, region, concurrency_limit, rate_limit, rate_window_s
    ON workflow_runs
    FOR EACH ROW EXECUTE FUNCTION phasegate_check_run_row();
DROP TRIGGER IF EXISTS workflow_runs_rules_on_next_seq ON workflow_runs;
CREATE TRIGGER workflow_runs_rules_on_next_seq AFTER UPDATE OF next_seq ON workflow_runs
    FOR EACH ROW WHEN (NEW.next_seq < 0)
    EXECUTE FUNCTION phasegate_check_run_row();
ALTER TABLE workflow_runs DROP CONSTRAINT IF EXISTS workflow_runs_row_valid;

DROP TRIGGER IF EXISTS checkpoints_rules ON checkpoints;
CREATE TRIGGER checkpoints_rules AFTER INSERT OR UPDATE OF kind, outcome ON checkpoints
    FOR EACH ROW WHEN (NEW.kind <> 'phase' OR NEW.outcome IS NOT NULL)
    EXECUTE FUNCTION phasegate_check_checkpoint_row();
ALTER TABLE checkpoints DROP CONSTRAINT IF EXISTS checkpoints_row_valid;
