"""The rules on run and checkpoint rows against real PostgreSQL (migration 0022: the rules in one
function per table; 0029: called by triggers that fire only on a write that can break them):
every rule the separate CHECKs enforced still refuses a bad row, on insert and on update, with
a check_violation that names the rule and does not echo the row; a commit that leaves its run
running calls no rule at all; the position trigger still follows every other writer and
ignores what it does not hold; the slot trigger still frees a slot only when a slot-holding
run ends."""

from __future__ import annotations

import asyncpg
import pytest

from phasegate.envelope import start_message
from phasegate.migrate import migrate
from phasegate.sql import migration_files
from tests.helpers import fetch, fetchval, store_for

INSERT_RUN = ("INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, "
              "current_phase, schema_version, input, classification, region, "
              "concurrency_limit, rate_limit, rate_window_s) "
              "VALUES ($1, 'wf', $2, $3, 'p0', 1, '{\"secret\": \"s3cr3t\"}', $4, $5, $6, $7, $8)")
GOOD = ("running", 0, "internal", None, None, None, None)


@pytest.mark.parametrize(("column", "value", "message"), [
    (0, "snoozing", '"snoozing" is not a run status'),
    (1, -1, "next_seq is never below 0"),
    (2, "top-secret", '"top-secret" is not a classification'),
    (2, "regulated", "a regulated run needs a region"),
    (4, 0, "above 0"),
    (5, 0, "above 0"),
    (6, 0.0, "above 0"),
])
async def test_a_run_row_that_breaks_a_rule_is_refused_by_name(database_url, column, value,
                                                                message):
    row = list(GOOD)
    row[column] = value
    names = ("status", "next_seq", "classification", "region", "concurrency_limit",
             "rate_limit", "rate_window_s")
    connection = await asyncpg.connect(database_url)
    try:
        with pytest.raises(asyncpg.CheckViolationError) as refused:
            await connection.execute(INSERT_RUN, f"rr-bad-{column}-{value}", *row)
        if names[column] not in ("classification", "region"):  # those are fixed at start
            # The same rule on an update of a good row.
            await connection.execute(INSERT_RUN, f"rr-ok-{column}-{value}", *GOOD)
            with pytest.raises(asyncpg.CheckViolationError) as on_update:
                await connection.execute(f"UPDATE workflow_runs SET {names[column]} = $2 "
                                         "WHERE workflow_id = $1", f"rr-ok-{column}-{value}",
                                         value)
            assert message in str(on_update.value)
    finally:
        await connection.close()
    assert message in str(refused.value)
    assert "s3cr3t" not in str(refused.value) and refused.value.detail is None


async def test_the_rules_let_every_good_row_through(database_url):
    connection = await asyncpg.connect(database_url)
    try:
        for i, status in enumerate(("pending", "running", "awaiting_review", "completed",
                                    "failed", "cancelled", "needs_restart", "waiting",
                                    "queued")):
            await connection.execute(INSERT_RUN, f"rr-good-{i}", status, i, "public", None,
                                     None, None, None)
        await connection.execute(INSERT_RUN, "rr-good-regulated", "running", 0, "regulated",
                                 "eu", 3, 10, 60.0)
        await connection.execute(INSERT_RUN, "rr-good-sensitive", "running", 0, "sensitive",
                                 "us", None, None, None)
    finally:
        await connection.close()
    assert await fetchval(database_url, "SELECT count(*) FROM workflow_runs "
                          "WHERE workflow_id LIKE 'rr-good-%'") == 11


@pytest.mark.parametrize(("kind", "outcome", "message"), [
    ("sideways", None, '"sideways" is not a checkpoint kind'),
    ("phase", "maybe", '"maybe" is not a checkpoint outcome'),
])
async def test_a_checkpoint_that_breaks_a_rule_is_refused_by_name(database_url, kind, outcome,
                                                                  message):
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(INSERT_RUN, f"rr-cp-{kind}", *GOOD)
        with pytest.raises(asyncpg.CheckViolationError) as refused:
            await connection.execute(
                "INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, "
                "state, state_hash, worker_id, outcome) VALUES ($1, 'main', 0, 'p0', $2, 1, "
                "'{\"secret\": \"s3cr3t\"}', 'h', 'w', $3)", f"rr-cp-{kind}", kind, outcome)
        for seq, (good_kind, good_outcome) in enumerate((
                ("phase", None), ("phase", "retry"), ("emergency", None),
                ("discarded", "review"))):
            await connection.execute(
                "INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, "
                "state, state_hash, worker_id, outcome) VALUES ($1, 'main', $2, 'p0', $3, 1, "
                "'{}', 'h', 'w', $4)", f"rr-cp-{kind}", seq, good_kind, good_outcome)
        # The same rule on an update of a good row.
        with pytest.raises(asyncpg.CheckViolationError) as on_update:
            await connection.execute(
                "UPDATE checkpoints SET kind = $2, outcome = $3 WHERE workflow_id = $1 "
                "AND seq = 0", f"rr-cp-{kind}", kind, outcome)
    finally:
        await connection.close()
    assert message in str(refused.value) and "s3cr3t" not in str(refused.value)
    assert message in str(on_update.value) and on_update.value.detail is None


RULES = ("phasegate_run_row_valid", "phasegate_checkpoint_row_valid")


async def _rules_called(connection: asyncpg.Connection) -> dict[str, int]:
    """How often each rule's function ran in this transaction (track_functions is on)."""
    rows = await connection.fetch("SELECT funcname, calls FROM pg_stat_xact_user_functions "
                                  "WHERE funcname = ANY($1::text[])", list(RULES))
    return {row["funcname"]: row["calls"] for row in rows}


async def hop_then_advance(connection: asyncpg.Connection, workflow_id: str) -> None:
    """A running run at seq 0: a continued hop (seq 0 -> 1), then a plain advance (1 -> 2),
    both committed (each statement returns its commit)."""
    assert await connection.fetchval(
        "SELECT phasegate_continue_phase($1, 'main', 0, 'p0', 1, '{}', 'h', 'p1', NULL, NULL, "
        "NULL, 'w1', NULL, NULL, NULL, NULL, NULL, 'w1', 30.0, '00-t')", workflow_id)
    assert await connection.fetchrow(
        "SELECT * FROM phasegate_advance_phase($1, 'main', 1, 'p1', 1, '{}', 'h', 'p2', NULL, "
        "NULL, NULL, 'w1', NULL, NULL, NULL, NULL, NULL, 'd-1', 'g', '{}')", workflow_id)


async def test_a_commit_that_leaves_its_run_running_calls_no_rule(database_url):
    """0029: a continued hop and a plain advance write no column a rule tests but next_seq,
    which they move forward, so neither rule's function runs; a run's end, a checkpoint with an
    outcome and an update of next_seq below 0 each run theirs."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(INSERT_RUN, "rr-hot", *GOOD)
        async with connection.transaction():
            await connection.execute("SET LOCAL track_functions = 'pl'")
            await hop_then_advance(connection, "rr-hot")
            assert await connection.fetchval("SELECT count(*) FROM checkpoints "
                                             "WHERE workflow_id = 'rr-hot'") == 2
            assert await _rules_called(connection) == {}
            # A status that moves, and a checkpoint that is not a plain phase's: each rule once.
            await connection.execute("UPDATE workflow_runs SET status = 'completed' "
                                     "WHERE workflow_id = 'rr-hot'")
            await connection.execute(
                "INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, "
                "state, state_hash, worker_id, outcome) VALUES ('rr-hot', 'main', 2, 'p2', "
                "'phase', 1, '{}', 'h', 'w', 'retry')")
            assert await _rules_called(connection) == dict.fromkeys(RULES, 1)
            with pytest.raises(asyncpg.CheckViolationError, match="never below 0"):
                await connection.execute("UPDATE workflow_runs SET next_seq = -1 "
                                         "WHERE workflow_id = 'rr-hot'")
    finally:
        await connection.close()


async def test_the_position_follows_other_writers_and_ignores_what_it_does_not_hold(
        database_url):
    async with store_for(database_url) as store:
        await store.start_run(workflow_id="rr-pos", workflow="wf", schema_version=1, input={},
                              first_phase="p0", message=start_message("rr-pos", "wf", {}))
    before = await fetch(database_url, "SELECT ctid, updated_at FROM run_positions "
                         "WHERE workflow_id = 'rr-pos'")
    # A review or an error alone: the position row is not even rewritten.
    await fetch(database_url, "UPDATE workflow_runs SET review = '{\"x\": 1}', error = 'e' "
                "WHERE workflow_id = 'rr-pos'")
    assert await fetch(database_url, "SELECT ctid, updated_at FROM run_positions "
                       "WHERE workflow_id = 'rr-pos'") == before
    # An operator's write that leaves the run row's updated_at (older than the position's, as
    # after any commit since 0023) moves what it changed and never the position's time back.
    # It names status, unchanged: the trigger fires for status or updated_at (0031).
    await fetch(database_url, "UPDATE run_positions SET updated_at = now() + interval '1 hour' "
                "WHERE workflow_id = 'rr-pos'")
    ahead = await fetchval(database_url, "SELECT updated_at FROM run_positions "
                           "WHERE workflow_id = 'rr-pos'")
    await fetch(database_url, "UPDATE workflow_runs SET tier = 7, status = status "
                "WHERE workflow_id = 'rr-pos'")
    assert tuple((await fetch(database_url, "SELECT tier, updated_at FROM run_positions "
                              "WHERE workflow_id = 'rr-pos'"))[0]) == (7, ahead)
    # An operator moves the run: the position follows; ends it: the position goes.
    await fetch(database_url, "UPDATE workflow_runs SET next_seq = 4, current_phase = 'p4', "
                "status = 'running', updated_at = now() WHERE workflow_id = 'rr-pos'")
    assert tuple((await fetch(database_url, "SELECT status, next_seq, current_phase FROM "
                              "run_positions WHERE workflow_id = 'rr-pos'"))[0]) == (
        "running", 4, "p4")
    await fetch(database_url, "UPDATE workflow_runs SET status = 'cancelled' "
                "WHERE workflow_id = 'rr-pos'")
    assert await fetchval(database_url, "SELECT count(*) FROM run_positions "
                          "WHERE workflow_id = 'rr-pos'") == 0


async def _populated_then_migrated(url: str, before: int) -> asyncpg.Connection:
    """Two runs and a checkpoint written at schema ``before``, then the next migration applied,
    and its file run once more by hand: the connection, for the test to look."""
    await migrate(url, target=before)
    connection = await asyncpg.connect(url)
    await connection.executemany(INSERT_RUN, [
        ("rr-m-a", "running", 3, "internal", None, None, None, None),
        ("rr-m-b", "waiting", 0, "regulated", "eu", 2, 5, 1.5)])
    await connection.execute(
        "INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, "
        "state, state_hash, worker_id, outcome) VALUES ('rr-m-a', 'main', 2, 'p2', 'phase', "
        "1, '{}', 'h', 'w', 'retry')")
    report = await migrate(url, target=before + 1)
    assert [int(applied[:4]) for applied in report.applied] == [before + 1]
    sql = next(text for version, _, text in migration_files() if version == before + 1)
    async with connection.transaction():
        await connection.execute(sql)
    assert await connection.fetchval("SELECT count(*) FROM workflow_runs") == 2
    assert await connection.fetchval("SELECT count(*) FROM checkpoints") == 1
    return connection


async def test_the_migration_on_a_populated_database_twice(empty_database_url):
    """Runs and checkpoints written at v21 stay; the old CHECKs are gone and the new ones
    enforce the same rules; the same file again changes nothing and fails nothing."""
    connection = await _populated_then_migrated(empty_database_url, 21)
    try:
        checks = {r["conname"] for r in await connection.fetch(
            "SELECT conname FROM pg_constraint WHERE contype = 'c' AND conrelid IN "
            "('workflow_runs'::regclass, 'checkpoints'::regclass)")}
        assert checks == {"workflow_runs_row_valid", "checkpoints_row_valid"}
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute("UPDATE workflow_runs SET status = 'snoozing' "
                                     "WHERE workflow_id = 'rr-m-a'")
    finally:
        await connection.close()


async def test_the_rules_move_to_triggers_on_a_populated_database_twice(empty_database_url):
    """0029 on runs and checkpoints written at v28: they stay; the CHECKs are gone and the
    triggers enforce the same rules; the same file again changes nothing and fails nothing."""
    connection = await _populated_then_migrated(empty_database_url, 28)
    try:
        assert await connection.fetchval(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'c' AND conrelid IN "
            "('workflow_runs'::regclass, 'checkpoints'::regclass)") == 0
        for bad in ("SET status = 'snoozing'", "SET next_seq = -1", "SET rate_limit = 0"):
            with pytest.raises(asyncpg.CheckViolationError):
                await connection.execute(f"UPDATE workflow_runs {bad} "
                                         "WHERE workflow_id = 'rr-m-b'")
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute("UPDATE checkpoints SET outcome = 'maybe'")
    finally:
        await connection.close()
