"""A run's checkpoints go with it, with no foreign key checked by each insert (migration 0025)
and no history index written by each phase (0026): deleting runs deletes their checkpoints of
every kind, including one committed while the delete waited; a writer that comes after a delete
writes nothing; the purge counts and deletes the rare kinds; a run's history is in commit order
across kinds and pages; and no reader of a run's checkpoints scans the table."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from phasegate.db import create_pool
from phasegate.envelope import canonical_json, state_hash
from phasegate.orchestrator.purge import purge
from phasegate.sql import queries
from phasegate.store import Store
from tests.helpers import fetch, fetchval, wait_for
from tests.integration.test_group_commit import waiting_on_locks

RUNS = """
INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, current_phase,
                           schema_version, input, finished_at)
SELECT id, 'wf', $2, 3, 'c', 1, '{}', CASE WHEN $2 = 'completed' THEN now() END
  FROM unnest($1::text[]) AS id
"""
CHECKPOINT = """
INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                         state_hash)
VALUES ($1, $2, $3, 'p', $4, 1, '{}', 'h')
RETURNING checkpoint_id
"""
# A fork at seq 0 with one branch, already discarded: the parent of a 'discarded' checkpoint.
DISCARDED_BRANCH = """
INSERT INTO forks (workflow_id, fork_seq, mode, merge_phase, branch_count, pending)
VALUES ($1, 0, 'race', 'm', 1, 0);
INSERT INTO branches (workflow_id, branch, fork_seq, ordinal, next_seq, status)
VALUES ($1, 'f0.0', 0, 0, 1, 'discarded');
"""


async def runs(database_url: str, *workflow_ids: str, status: str = "running") -> None:
    await fetch(database_url, RUNS, list(workflow_ids), status)


async def kinds_of(database_url: str, workflow_id: str) -> list[str]:
    rows = await fetch(database_url, "SELECT kind FROM checkpoints WHERE workflow_id = $1 "
                       "ORDER BY checkpoint_id", workflow_id)
    return [row["kind"] for row in rows]


async def every_kind(database_url: str, workflow_id: str) -> None:
    """Phase checkpoints at seq 0-2, an emergency one at 3, a discarded branch's one."""
    for seq in range(3):
        await fetch(database_url, CHECKPOINT, workflow_id, "main", seq, "phase")
    await fetch(database_url, CHECKPOINT, workflow_id, "main", 3, "emergency")
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(DISCARDED_BRANCH.replace("$1", f"'{workflow_id}'"))
    finally:
        await connection.close()
    await fetch(database_url, CHECKPOINT, workflow_id, "f0.0", 1, "discarded")


async def one_waiting(database_url: str, what: str) -> None:
    """Until exactly one backend of the database waits on a lock."""

    async def waiting() -> bool:
        return await waiting_on_locks(database_url) == 1

    await wait_for(waiting, timeout=30, what=what)


async def test_the_foreign_key_and_the_history_index_are_gone(database_url):
    """What the migrations took off the hot insert; the rare kinds' index is there instead."""
    foreign = await fetchval(database_url, "SELECT count(*) FROM pg_constraint WHERE "
                             "conrelid = 'checkpoints'::regclass AND contype = 'f'")
    indexes = {row["indexname"] for row in await fetch(
        database_url, "SELECT indexname FROM pg_indexes WHERE tablename = 'checkpoints'")}
    assert foreign == 0
    assert "checkpoints_history_idx" not in indexes
    assert {"checkpoints_pkey", "checkpoints_phase_key", "checkpoints_rare_history_idx"} <= indexes


async def test_a_deleted_run_takes_every_kind_of_its_checkpoints_along(database_url):
    await runs(database_url, "wf_gone", "wf_kept")
    await every_kind(database_url, "wf_gone")
    await every_kind(database_url, "wf_kept")
    assert await kinds_of(database_url, "wf_gone") == [
        "phase", "phase", "phase", "emergency", "discarded"]

    # An operator's plain DELETE, as the cascade of the foreign key handled it before.
    await fetch(database_url, "DELETE FROM workflow_runs WHERE workflow_id = 'wf_gone'")

    assert await kinds_of(database_url, "wf_gone") == []
    assert len(await kinds_of(database_url, "wf_kept")) == 5


async def test_a_checkpoint_committed_while_the_delete_waited_goes_too(database_url):
    """The emergency checkpoint holds its run's row (FOR KEY SHARE) until it commits; the
    DELETE waits for it, then the trigger, with a snapshot of its own, finds the checkpoint the
    DELETE's own snapshot never saw."""
    await runs(database_url, "wf_race")
    writer = await asyncpg.connect(database_url)
    deleter = await asyncpg.connect(database_url)
    try:
        transaction = writer.transaction()
        await transaction.start()
        written = await writer.fetchval(
            queries()["emergency_checkpoint"], "wf_race", "main", 3, "c", 1, "{}", "h", "w1")
        assert written is not None
        deleting = asyncio.ensure_future(
            deleter.execute("DELETE FROM workflow_runs WHERE workflow_id = 'wf_race'"))
        await one_waiting(database_url, "the DELETE waiting on the run's row")
        await transaction.commit()
        assert await deleting == "DELETE 1"
    finally:
        await writer.close()
        await deleter.close()
    assert await kinds_of(database_url, "wf_race") == []


@pytest.mark.parametrize("kind", ["emergency", "discarded"])
async def test_a_checkpoint_written_behind_a_delete_writes_nothing(database_url, kind):
    """The two checkpoint writers that update no row of their own read the run's (or the
    branch's) row FOR KEY SHARE: behind an uncommitted DELETE of the run they wait, then find
    nothing to write for."""
    await runs(database_url, "wf_late")
    if kind == "discarded":
        await every_kind(database_url, "wf_late")
        await fetch(database_url, "DELETE FROM checkpoints WHERE workflow_id = 'wf_late'")
    deleter = await asyncpg.connect(database_url)
    writer = await asyncpg.connect(database_url)
    try:
        transaction = deleter.transaction()
        await transaction.start()
        await deleter.execute("DELETE FROM workflow_runs WHERE workflow_id = 'wf_late'")
        writing = asyncio.ensure_future(
            writer.fetchval(queries()["emergency_checkpoint"], "wf_late", "main", 3, "c", 1,
                            "{}", "h", "w1") if kind == "emergency"
            else writer.fetchval(queries("branches.sql")["branch_discarded"], "wf_late",
                                 "f0.0", 1, "p", 1, "{}", "h", None, None, "w1", None))
        await one_waiting(database_url, f"the {kind} checkpoint waiting")
        await transaction.commit()
        assert await writing is None  # no row to write for: nothing written
    finally:
        await deleter.close()
        await writer.close()
    assert await kinds_of(database_url, "wf_late") == []


async def test_the_emergency_checkpoint_still_writes_for_a_running_run(database_url):
    """The lock changes nothing for a live run: the store's emergency flush writes as before,
    and only at the run's seq."""
    await runs(database_url, "wf_live")
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        store = Store(pool)
        args = {"workflow_id": "wf_live", "branch": "main", "phase": "c",
                "schema_version": 1, "state": {"n": 1}, "worker_id": "w1"}
        assert await store.emergency_checkpoint(seq=3, **args) is True
        assert await store.emergency_checkpoint(seq=2, **args) is False
    finally:
        await pool.close()
    row = (await fetch(database_url, "SELECT kind, state_hash FROM checkpoints "
                       "WHERE workflow_id = 'wf_live'"))[0]
    assert tuple(row) == ("emergency", state_hash(canonical_json({"n": 1})))


async def test_the_purge_counts_and_deletes_every_kind(database_url):
    await runs(database_url, "wf_old_1", "wf_old_2", status="completed")
    await runs(database_url, "wf_live_1")
    for workflow_id in ("wf_old_1", "wf_old_2", "wf_live_1"):
        await every_kind(database_url, workflow_id)
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        counted = await purge(pool, timedelta(0), dry_run=True)
        assert (counted.runs, counted.checkpoints) == (2, 10)
        done = await purge(pool, timedelta(0), batch_size=1)
    finally:
        await pool.close()
    assert (done.runs, done.checkpoints, done.batches) == (2, 10, 2)
    assert await fetchval(database_url, "SELECT count(*) FROM checkpoints") == 5
    assert await kinds_of(database_url, "wf_old_1") == []
    assert len(await kinds_of(database_url, "wf_live_1")) == 5


async def test_the_history_is_in_commit_order_across_kinds_and_pages(database_url):
    await runs(database_url, "wf_hist")
    written = []
    for seq, kind in [(0, "phase"), (1, "emergency"), (1, "phase"), (2, "emergency"),
                      (2, "emergency"), (2, "phase")]:
        written.append(await fetchval(database_url, CHECKPOINT, "wf_hist", "main", seq, kind))
    history = queries("control.sql")["checkpoints"]
    pages, after = [], 0
    while True:
        page = await fetch(database_url, history, "wf_hist", False, after, 4)
        if not page:
            break
        pages.append([(row["checkpoint_id"], row["kind"]) for row in page])
        after = page[-1]["checkpoint_id"]
    assert [len(page) for page in pages] == [4, 2]
    assert [checkpoint for page in pages for checkpoint, _ in page] == written
    assert [kind for page in pages for _, kind in page] == [
        "phase", "emergency", "phase", "emergency", "emergency", "phase"]


# Every query that reads a run's checkpoints without naming one seq of one branch, with the
# types of its parameters and sample arguments.
WHOLE_RUN_READERS = [
    ("control.sql", "checkpoints", "text, bool, bigint, int", "'wf_plan', true, 0, 1001"),
    ("control.sql", "purge_count", "interval, text", "'1 day', NULL"),
    ("control.sql", "purge_batch", "interval, int, text", "'1 day', 500, NULL"),
    ("branches.sql", "branch_tree", "text", "'wf_plan'"),
]


@pytest.mark.parametrize(("file", "name", "types", "args"), WHOLE_RUN_READERS,
                         ids=[reader[1] for reader in WHOLE_RUN_READERS])
async def test_no_reader_of_a_runs_checkpoints_scans_the_table(database_url, file, name,
                                                              types, args):
    """With sequential scans priced out, a query that still scans ``checkpoints`` has no index
    to go by: without the history index (0026) each kind must be read through its own."""
    await runs(database_url, "wf_plan")
    await every_kind(database_url, "wf_plan")
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("SET enable_seqscan = off")
        await connection.execute(f"PREPARE reader({types}) AS {queries(file)[name]}")
        plan = "\n".join(row[0] for row in await connection.fetch(
            f"EXPLAIN EXECUTE reader({args})"))
    finally:
        await connection.close()
    assert "Seq Scan on checkpoints" not in plan, plan
    assert "checkpoints" in plan
