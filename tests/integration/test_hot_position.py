"""The hot position (migration 0017): a plain commit updates its run row HOT, alone and under
group commit; run_positions follows every write of a run, whoever makes it; the migration on
a populated database, twice."""

from __future__ import annotations

import asyncpg
import pytest

from bench.lean_commit import measure, migrate_before
from phasegate.envelope import state_hash
from phasegate.migrate import migrate
from phasegate.sql import migration_files, queries
from phasegate.store import Lease, Store, create_pool
from tests.helpers import fetch, fetchval
from tests.integration.test_access import denied, login_user
from tests.integration.test_group_commit import commit_of, running

ENDED = ("completed", "failed", "cancelled")
# Every run that has not ended, as its position should read; and any position that has no
# such run or differs from it. updated_at: equal, except that a continued hop (migration 0021)
# moves only the position's, so the position's is never older.
DISAGREEMENTS = """
SELECT coalesce(r.workflow_id, p.workflow_id) AS workflow_id
  FROM (SELECT workflow_id, workflow, status, next_seq, current_phase, tier, tier_label,
               updated_at
          FROM workflow_runs WHERE status NOT IN ('completed', 'failed', 'cancelled')) r
  FULL JOIN run_positions p USING (workflow_id)
 WHERE (r.workflow, r.status, r.next_seq, r.current_phase, r.tier, r.tier_label)
       IS DISTINCT FROM
       (p.workflow, p.status, p.next_seq, p.current_phase, p.tier, p.tier_label)
    OR NOT coalesce(p.updated_at >= r.updated_at, false)
"""


@pytest.mark.parametrize("path", ["single", "group"])
async def test_plain_commits_update_the_run_row_and_its_position_hot(database_url, path):
    figures = await measure(database_url, runs=4, phases=12, grouped=path == "group")
    assert figures["committed"] == 48
    if path == "group":
        assert figures["grouped_statements"] > 0  # commit_phases ran, not only commit_phase
    # No index names a column that a plain commit changes (updated_at is the position's since
    # 0023: every column the commit changes comes before the run's input)...
    assert set(figures["changed_columns"]) >= {"next_seq", "current_phase"}
    assert "updated_at" not in figures["changed_columns"]
    assert figures["blocking_indexes"] == {}
    # ...so (pages having room: fillfactor) the updates of both rows are HOT. Not every one:
    # a page is pruned of dead versions only when no snapshot still sees them, so a concurrent
    # reader (autovacuum, the statistics reads) can leave one full for an update or two (seen:
    # 44 of 48). Without 0017 none is.
    for table in ("workflow_runs", "run_positions"):
        counted = figures["tables"][table]
        assert counted["updates"] == 48, (table, figures["tables"])
        assert counted["hot_updates"] >= 40, (table, figures["tables"])
    assert await fetch(database_url, DISAGREEMENTS) == []


async def test_before_the_migration_no_commit_was_hot(empty_database_url):
    """The same measurement with the indexes 0017 dropped put back: it sees what made every
    update non-HOT (so the test above could fail)."""
    await migrate_before(empty_database_url)
    figures = await measure(empty_database_url, runs=2, phases=5, grouped=False)
    assert figures["tables"]["workflow_runs"] == {"updates": 10, "hot_updates": 0,
                                                  "hot_ratio": 0.0}
    assert set(figures["blocking_indexes"]) == {"workflow_runs_stall_idx",
                                                "workflow_runs_phase_created_idx"}


async def test_positions_follow_every_write_of_a_run(database_url):
    connection = await asyncpg.connect(database_url)
    try:
        async def positions() -> dict[str, tuple[str, int, str | None]]:
            assert await connection.fetch(DISAGREEMENTS) == []
            rows = await connection.fetch(
                "SELECT workflow_id, status, next_seq, current_phase FROM run_positions")
            return {r["workflow_id"]: (r["status"], r["next_seq"], r["current_phase"])
                    for r in rows}

        await connection.execute(
            "INSERT INTO workflow_runs (workflow_id, workflow, schema_version, current_phase) "
            "VALUES ('p-1', 'w', 1, 'a'), ('p-2', 'w', 1, 'a')")
        await connection.execute(
            "INSERT INTO workflow_runs (workflow_id, workflow, schema_version, status, "
            "finished_at) VALUES ('p-done', 'w', 1, 'completed', now())")
        assert await positions() == {"p-1": ("pending", 0, "a"), "p-2": ("pending", 0, "a")}
        await connection.execute("UPDATE workflow_runs SET status = 'running', next_seq = 3, "
                                 "current_phase = 'b' WHERE workflow_id = 'p-1'")
        # A write that moves only the tier and names updated_at, as every writer but the
        # commits that own the position does (migration 0031), moves the position too.
        await connection.execute("UPDATE workflow_runs SET tier = 2, tier_label = 'found', "
                                 "updated_at = now() WHERE workflow_id = 'p-1'")
        assert (await positions())["p-1"] == ("running", 3, "b")
        # Ended: the position goes; resumed (a retry): it comes back.
        await connection.execute("UPDATE workflow_runs SET status = 'failed' "
                                 "WHERE workflow_id = 'p-1'")
        assert set(await positions()) == {"p-2"}
        await connection.execute("UPDATE workflow_runs SET status = 'running', "
                                 "updated_at = now() WHERE workflow_id = 'p-1'")
        assert (await positions())["p-1"] == ("running", 3, "b")
        # A write that moves nothing the position holds writes nothing there (the
        # backend's own counters, read in one transaction: nothing is published meanwhile).
        counted = ("SELECT n_tup_upd FROM pg_stat_xact_user_tables "
                   "WHERE relname = 'run_positions'")
        async with connection.transaction():
            before = await connection.fetchval(counted)
            await connection.execute("UPDATE workflow_runs SET attempts = 1, error = 'e' "
                                     "WHERE workflow_id = 'p-2'")
            assert await connection.fetchval(counted) == before
            await connection.execute("UPDATE workflow_runs SET next_seq = 1, "
                                     "updated_at = now() WHERE workflow_id = 'p-2'")
            assert await connection.fetchval(counted) == before + 1
        await connection.execute("DELETE FROM workflow_runs WHERE workflow_id = 'p-2'")
        assert set(await positions()) == {"p-1"}
    finally:
        await connection.close()


async def test_no_role_writes_positions_but_the_triggers(database_url):
    async with login_user(database_url, "phasegate_worker") as worker_dsn:
        connection = await asyncpg.connect(worker_dsn)
        try:
            # The worker writes runs; the trigger writes their positions with its owner's
            # rights. Writing a position directly is refused.
            await connection.execute(
                "INSERT INTO workflow_runs (workflow_id, workflow, schema_version) "
                "VALUES ('r-1', 'w', 1)")
            await connection.execute("UPDATE workflow_runs SET status = 'running' "
                                     "WHERE workflow_id = 'r-1'")
            assert await connection.fetchval(
                "SELECT status FROM run_positions WHERE workflow_id = 'r-1'") == "running"
            assert await denied(connection, "UPDATE run_positions SET status = 'pending'")
            assert await denied(connection, "DELETE FROM run_positions")
            assert await denied(connection, "INSERT INTO run_positions VALUES "
                                "('x', 'w', 'running', 0, NULL, NULL, NULL, now())")
        finally:
            await connection.close()


async def test_the_migration_on_a_populated_database_twice(empty_database_url):
    await migrate(empty_database_url, target=16)
    statuses = ["pending", "running", "awaiting_review", "needs_restart", "waiting", "queued",
                *ENDED]
    connection = await asyncpg.connect(empty_database_url)
    try:
        await connection.executemany(
            "INSERT INTO workflow_runs (workflow_id, workflow, schema_version, status, "
            "next_seq, current_phase, tier, tier_label, updated_at) "
            "VALUES ($1, 'w', 1, $2, $3, 'ph', 1, 't', now() - interval '1 hour')",
            [(f"m-{s}", s, i) for i, s in enumerate(statuses)])
        report = await migrate(empty_database_url, target=17)
        assert report.applied[-1] == "0017_hot_position"
        assert await connection.fetch(DISAGREEMENTS) == []
        unfinished = {f"m-{s}" for s in statuses if s not in ENDED}
        assert {r["workflow_id"] for r in await connection.fetch(
            "SELECT workflow_id FROM run_positions")} == unfinished
        # Idempotent: the same file again changes nothing and fails nothing.
        sql = next(text for version, _, text in migration_files() if version == 17)
        async with connection.transaction():
            await connection.execute(sql)
        assert await connection.fetch(DISAGREEMENTS) == []
        assert await connection.fetchval("SELECT count(*) FROM run_positions") == len(unfinished)
        indexes = {r["indexname"] for r in await connection.fetch(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'workflow_runs'")}
        assert not indexes & {"workflow_runs_stall_idx", "workflow_runs_phase_created_idx"}
        assert "fillfactor=70" in await fetchval(
            empty_database_url,
            "SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = 'workflow_runs'")
    finally:
        await connection.close()


async def test_the_worker_role_commits_through_the_function_and_a_reader_cannot(database_url):
    """The commit runs with its owner's rights (it writes the position and its chain lease,
    which the worker role cannot do directly): the worker role commits, single and grouped,
    with a lease; extends and ends its chain; the position follows without the trigger; a
    reader may not call any of them."""
    async with login_user(database_url, "phasegate_worker") as worker_dsn:
        pool = await create_pool(worker_dsn, min_size=1, max_size=2)
        try:
            store = Store(pool)
            await running(store, "wr-1")
            result = await store.commit_phase(commit_of("wr-1"), lease=Lease("w-1", 60.0))
            assert result is not None and result[1] is None  # a chain lease, no row
            assert await store.extend_chains(["wr-1"], Lease("w-1", 90.0)) == {"wr-1"}
            grouped = Store(pool, commit_window_s=0.001)
            assert await grouped.commit_phase(commit_of("wr-1", 1, status="completed")) \
                is not None
        finally:
            await pool.close()
    assert await fetchval(database_url,
                          "SELECT status FROM workflow_runs WHERE workflow_id = 'wr-1'") \
        == "completed"
    assert await fetch(database_url, DISAGREEMENTS) == []
    assert await fetchval(database_url, "SELECT count(*) FROM run_positions "
                          "WHERE workflow_id = 'wr-1'") == 0
    async with login_user(database_url, "phasegate_reader") as reader_dsn:
        connection = await asyncpg.connect(reader_dsn)
        try:
            assert await denied(connection, "SELECT * FROM phasegate_commit_phase("
                                + ", ".join(["NULL"] * 27) + ")")
            assert await denied(connection, "SELECT phasegate_end_chain("
                                + ", ".join(["NULL"] * 8) + ")")
            assert await denied(connection, "SELECT phasegate_extend_chains(NULL, NULL, 1)")
        finally:
            await connection.close()


async def test_the_commit_flag_never_outlives_its_statement(database_url):
    """The trigger stands down only for the commit's own statement: a plain write of the
    run right after a commit, in the same transaction, moves the position again."""
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        await running(Store(pool), "wr-2")
        async with pool.acquire() as connection, connection.transaction():
            committed = await connection.fetchrow(
                queries()["commit_phase"], "wr-2", "main", 0, "a", 1, "{}", state_hash("{}"),
                "b", "running", None, None, None, "test", None, "wr-2:1", "g", "{}", None, None,
                None, None, None, None, None, None, 0.0, None)
            assert committed["committed_at"] is not None
            assert await connection.fetchval(
                "SELECT current_setting('phasegate.own_position', true)") == "off"
            # Naming updated_at, as every writer that does not own the position does (0031).
            await connection.execute("UPDATE workflow_runs SET current_phase = 'elsewhere', "
                                     "updated_at = now() WHERE workflow_id = 'wr-2'")
    finally:
        await pool.close()
    assert await fetchval(database_url, "SELECT current_phase FROM run_positions "
                          "WHERE workflow_id = 'wr-2'") == "elsewhere"
    assert await fetch(database_url, DISAGREEMENTS) == []
