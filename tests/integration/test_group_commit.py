"""Group commit against real Postgres (direct and through PgBouncer in transaction mode).

Batches are forced, not hoped for: a separate connection holds the row lock of one run, its
commit goes out alone and waits on the lock, and the commits submitted meanwhile queue behind
it (the window is far longer than the test); releasing the lock sends them as one statement.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime

import asyncpg
import pytest

from phasegate.db import create_pool
from phasegate.envelope import canonical_json, phase_message, start_message, state_hash
from phasegate.group_commit import GroupCommit
from phasegate.store import Lease, PhaseCommit, Store
from tests.helpers import fetch, fetchval, pooler_for, wait_for

# Long enough that no batch in these tests is sent by the timer: only by the lock's release.
HELD_WINDOW_S = 60.0
Result = tuple[datetime, int | None] | None


@asynccontextmanager
async def grouped_store(database_url: str, window_s: float = HELD_WINDOW_S, *,
                        pool_size: int = 4) -> AsyncIterator[Store]:
    """A worker's store; its default pool (4) is large enough to keep a connection."""
    pool = await create_pool(database_url, min_size=1, max_size=pool_size,
                             pooler=pooler_for(database_url))
    try:
        yield Store(pool, commit_window_s=window_s)
    finally:
        await pool.close()


def commit_of(workflow_id: str, seq: int = 0, *, status: str = "running",
              state_json: str | None = None) -> PhaseCommit:
    canonical = state_json if state_json is not None else canonical_json({"id": workflow_id})
    return PhaseCommit(
        workflow_id=workflow_id, branch="main", seq=seq, phase="a", schema_version=1,
        state_json=canonical, state_hash=state_hash(canonical), next_phase="b", status=status,
        worker_id="test", successor=phase_message(workflow_id, "wf", seq + 1, "b"))


async def running(store: Store, *workflow_ids: str) -> None:
    for workflow_id in workflow_ids:
        await store.start_run(workflow_id=workflow_id, workflow="wf", schema_version=1,
                              input={}, first_phase="a",
                              message=start_message(workflow_id, "wf", {}))
        assert await store.load_for_phase(workflow_id) is not None  # pending -> running


async def waiting_on_locks(database_url: str) -> int:
    return int(await fetchval(
        database_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock'"))


@asynccontextmanager
async def held(database_url: str, *workflow_ids: str) -> AsyncIterator[asyncpg.Connection]:
    """Row locks on these runs until the block ends (the connection's transaction rolls back)."""
    holder = await asyncpg.connect(database_url)
    try:
        transaction = holder.transaction()
        await transaction.start()
        await holder.fetch("SELECT 1 FROM workflow_runs WHERE workflow_id = ANY($1) FOR UPDATE",
                           list(workflow_ids))
        try:
            yield holder
        finally:
            await transaction.rollback()
    finally:
        await holder.close()


def submitted(store: Store, commits: list[PhaseCommit]) -> list[asyncio.Future[Result]]:
    return [asyncio.ensure_future(store.commit_phase(commit)) for commit in commits]


async def until_queued(store: Store, count: int) -> None:
    group = store.group_commit
    assert group is not None

    async def queued() -> bool:
        return group.queued == count

    await wait_for(queued, timeout=30, what=f"{count} commits queued behind the held one")


async def checkpoints_of(database_url: str, workflow_id: str) -> list[int]:
    rows = await fetch(database_url, "SELECT seq FROM checkpoints WHERE workflow_id = $1 "
                       "AND kind = 'phase' ORDER BY seq", workflow_id)
    return [row["seq"] for row in rows]


async def outbox_seqs(database_url: str, workflow_id: str) -> list[int]:
    rows = await fetch(database_url, "SELECT seq FROM outbox WHERE workflow_id = $1 "
                       "ORDER BY seq", workflow_id)
    return [row["seq"] for row in rows]


async def test_a_batch_of_good_stale_duplicate_and_halted_commits(database_url):
    async with grouped_store(database_url) as store:
        await running(store, "wf_gc_head", "wf_gc_good", "wf_gc_stale", "wf_gc_dup")
        await store.start_run(workflow_id="wf_gc_pending", workflow="wf", schema_version=1,
                              input={}, first_phase="a",
                              message=start_message("wf_gc_pending", "wf", {}))
        async with held(database_url, "wf_gc_head"):
            head = submitted(store, [commit_of("wf_gc_head")])
            await wait_for(lambda: _waiting(database_url, 1), timeout=30,
                           what="the head commit waiting on the held row")
            batch = submitted(store, [
                commit_of("wf_gc_good"), commit_of("wf_gc_stale", seq=3),
                commit_of("wf_gc_dup"), commit_of("wf_gc_dup"), commit_of("wf_gc_pending")])
            await until_queued(store, 5)
        head_result = await head[0]
        good, stale, dup_a, dup_b, pending = await asyncio.gather(*batch)
        assert store.group_commit is not None and store.group_commit.statements == 1

    assert head_result is not None and good is not None and good[1] is not None
    assert stale is None and pending is None
    assert [dup_a is None, dup_b is None].count(True) == 1
    for workflow_id in ("wf_gc_head", "wf_gc_good", "wf_gc_dup"):
        assert await checkpoints_of(database_url, workflow_id) == [0]
        assert await outbox_seqs(database_url, workflow_id) == [0, 1]
    for workflow_id in ("wf_gc_stale", "wf_gc_pending"):
        assert await checkpoints_of(database_url, workflow_id) == []
        assert await outbox_seqs(database_url, workflow_id) == [0]
    winner = dup_a if dup_a is not None else dup_b
    assert winner is not None
    ids = await fetch(database_url, "SELECT workflow_id, outbox_id FROM outbox WHERE seq = 1")
    assert {row["workflow_id"]: row["outbox_id"] for row in ids} == {
        "wf_gc_head": head_result[1], "wf_gc_good": good[1], "wf_gc_dup": winner[1]}
    run = await fetch(database_url, "SELECT next_seq, current_phase FROM workflow_runs "
                      "WHERE workflow_id = 'wf_gc_good'")
    assert tuple(run[0]) == (1, "b")


async def _waiting(database_url: str, count: int) -> bool:
    return await waiting_on_locks(database_url) == count


Call = tuple[PhaseCommit, Lease | None]


def _answers(results: list[Result | BaseException]) -> list[Result]:
    """The answers of calls none of which may have failed."""
    failed = [result for result in results if isinstance(result, BaseException)]
    assert not failed, failed
    return [result for result in results if not isinstance(result, BaseException)]


async def behind_a_held_head(database_url: str, store: Store, head: Call, calls: list[Call]
                             ) -> tuple[Result, list[Result | BaseException]]:
    """``head`` goes alone and waits on its run's row lock, held meanwhile; ``calls`` queue
    behind it and go together once the lock is released. The head's answer and each call's
    (an exception in its place when it failed)."""
    async with held(database_url, head[0].workflow_id):
        first = asyncio.ensure_future(store.commit_phase(head[0], lease=head[1]))
        await wait_for(lambda: _waiting(database_url, 1), timeout=30,
                       what="the head commit waiting on the held row")
        batch = [asyncio.ensure_future(store.commit_phase(commit, lease=lease))
                 for commit, lease in calls]
        await until_queued(store, len(batch))
    return await first, list(await asyncio.gather(*batch, return_exceptions=True))


@pytest.mark.parametrize("bad", ["constraint", "unstorable"])
async def test_a_failing_row_fails_alone(database_url, bad):
    """The statement fails as a whole (a CHECK violation, a state that is not JSON); the batch
    falls back to single commits, so only the bad commit raises."""
    async with grouped_store(database_url) as store:
        await running(store, "wf_gc_head", "wf_gc_ok1", "wf_gc_bad", "wf_gc_ok2")
        wrong = (commit_of("wf_gc_bad", status="bogus") if bad == "constraint"
                 else commit_of("wf_gc_bad", state_json='{"not json'))
        async with held(database_url, "wf_gc_head"):
            head = submitted(store, [commit_of("wf_gc_head")])
            await wait_for(lambda: _waiting(database_url, 1), timeout=30,
                           what="the head commit waiting on the held row")
            batch = submitted(store, [commit_of("wf_gc_ok1"), wrong, commit_of("wf_gc_ok2")])
            await until_queued(store, 3)
        assert await head[0] is not None
        ok1, failed, ok2 = await asyncio.gather(*batch, return_exceptions=True)
        assert store.group_commit is not None and store.group_commit.statements == 0

    assert isinstance(failed, asyncpg.PostgresError)
    assert ok1 is not None and not isinstance(ok1, BaseException)
    assert ok2 is not None and not isinstance(ok2, BaseException)
    for workflow_id in ("wf_gc_ok1", "wf_gc_ok2"):
        assert await checkpoints_of(database_url, workflow_id) == [0]
    assert await checkpoints_of(database_url, "wf_gc_bad") == []
    status = await fetchval(database_url, "SELECT status FROM workflow_runs "
                            "WHERE workflow_id = 'wf_gc_bad'")
    assert status == "running"  # nothing half-done: the run is where it was


RUNS = [f"wf_gc_race_{i}" for i in range(6)]


@pytest.mark.parametrize("round_", range(3))
async def test_two_workers_committing_the_same_runs_commit_each_once(database_url, round_):
    """Two processes' group commits (two pools) hold the same six commits, batched, released
    together against the row locks: every run commits exactly once, and each commit's caller
    is told whether it won."""
    runs = [f"{name}_{round_}" for name in RUNS]
    async with grouped_store(database_url) as first, grouped_store(database_url) as second:
        await running(first, *runs)
        async with held(database_url, *runs):
            lone = submitted(first, [commit_of(runs[0])]) + submitted(second,
                                                                      [commit_of(runs[0])])
            await wait_for(lambda: _waiting(database_url, 2), timeout=30,
                           what="both workers' first commits waiting on the held rows")
            rest = [commit_of(run) for run in runs[1:]]
            batched = submitted(first, rest) + submitted(second, rest)
            await until_queued(first, 5)
            await until_queued(second, 5)
        results = await asyncio.gather(*lone, *batched)
    by_run: dict[str, list[Result]] = {run: [] for run in runs}
    for commit_run, result in zip([runs[0], runs[0], *runs[1:], *runs[1:]], results,
                                  strict=True):
        by_run[commit_run].append(result)
    for run in runs:
        assert [r is None for r in by_run[run]].count(False) == 1, run
        assert await checkpoints_of(database_url, run) == [0]
        assert await outbox_seqs(database_url, run) == [0, 1]


async def test_a_lone_commit_is_sent_at_once(database_url):
    """Nothing in flight: the commit goes out alone, without waiting for the window."""
    async with grouped_store(database_url) as store:
        await running(store, "wf_gc_lone")
        result = await asyncio.wait_for(store.commit_phase(commit_of("wf_gc_lone")),
                                        timeout=HELD_WINDOW_S / 2)
        assert result is not None
        assert store.group_commit is not None and store.group_commit.statements == 0


async def test_many_concurrent_commits_through_a_short_window(database_url):
    """The production shape: many transitions commit at once with a 2 ms window; runs at two
    seqs each, in order, end where they should."""
    runs = [f"wf_gc_many_{i}" for i in range(24)]
    async with grouped_store(database_url, window_s=0.002) as store:
        await running(store, *runs)
        for seq in range(2):
            results = await asyncio.gather(*(store.commit_phase(commit_of(run, seq))
                                             for run in runs))
            assert all(result is not None for result in results)
    rows = await fetch(database_url, "SELECT count(*) FROM checkpoints WHERE workflow_id "
                       "LIKE 'wf_gc_many_%'")
    assert rows[0][0] == 48
    assert await outbox_seqs(database_url, runs[-1]) == [0, 1, 2]


async def test_back_to_back_commits_keep_one_connection_until_idle(database_url, db_route):
    """A chain's commits come back to back: they share one connection (no pool acquire per
    commit), which goes back to the pool once idle, so the pool can close."""
    async with grouped_store(database_url) as store:
        group = store.group_commit
        assert group is not None
        await running(store, "wf_gc_kept")
        pids = set()
        for seq in range(3):
            assert await store.commit_phase(commit_of("wf_gc_kept", seq)) is not None
            pids.add(group.kept_server_pid)
        assert None not in pids
        if not db_route.startswith("pgbouncer"):  # behind a pooler the server process may change
            assert len(pids) == 1

        async def given_back() -> bool:
            return group.kept_server_pid is None

        await wait_for(given_back, timeout=10, what="the idle connection back in the pool")
        await asyncio.wait_for(store.pool.close(), timeout=10)
    assert await checkpoints_of(database_url, "wf_gc_kept") == [0, 1, 2]


async def test_a_kept_connection_the_server_ended_is_replaced(database_url, db_route):
    """The server ends the kept connection between two commits (a restart, a failover, an
    operator): the next commit runs on a fresh one and succeeds."""
    if db_route.startswith("pgbouncer"):
        pytest.skip("terminates the server backend directly; PgBouncer would hide which")
    async with grouped_store(database_url) as store:
        group = store.group_commit
        assert group is not None
        await running(store, "wf_gc_ended")
        assert await store.commit_phase(commit_of("wf_gc_ended", 0)) is not None
        pid = group.kept_server_pid
        assert pid is not None
        assert await fetchval(database_url, "SELECT pg_terminate_backend($1)", pid)

        async def noticed() -> bool:  # the client sees the socket close
            return await fetchval(database_url, "SELECT count(*) FROM pg_stat_activity "
                                  "WHERE pid = $1", pid) == 0

        await wait_for(noticed, timeout=10, what="the kept connection's backend gone")
        assert await store.commit_phase(commit_of("wf_gc_ended", 1)) is not None
        assert group.kept_server_pid not in (None, pid)
    assert await checkpoints_of(database_url, "wf_gc_ended") == [0, 1]


async def test_a_small_pool_keeps_no_connection(database_url):
    """Below three connections the pool lends one per statement and takes it back: keeping
    one would starve steps, heartbeats and the other group."""
    async with grouped_store(database_url, pool_size=2) as store:
        await running(store, "wf_gc_small")
        assert await store.commit_phase(commit_of("wf_gc_small")) is not None
        assert store.group_commit is not None and store.group_commit.kept_server_pid is None
        assert store.pool.get_idle_size() == store.pool.get_size()


async def test_a_connection_is_not_kept_while_the_pool_has_none_to_spare(database_url):
    """Every other connection of the pool is taken (steps, a heartbeat): the commit's own goes
    back at once, for whoever waits, instead of sitting with the group commit."""
    async with grouped_store(database_url, pool_size=3) as store:
        await running(store, "wf_gc_busy")
        others = [await store.pool.acquire() for _ in range(2)]
        try:
            assert await store.commit_phase(commit_of("wf_gc_busy")) is not None
            assert store.group_commit is not None and store.group_commit.kept_server_pid is None
            assert store.pool.get_idle_size() == 1
        finally:
            for connection in others:
                await store.pool.release(connection)
        assert await store.commit_phase(commit_of("wf_gc_busy", 1)) is not None
        assert store.group_commit.kept_server_pid is not None  # room again: kept


def test_a_window_of_zero_is_not_a_group_commit():
    with pytest.raises(ValueError, match="window"):
        GroupCommit(None, single_sql="", batch_sql="", window_s=0)  # type: ignore[arg-type]



async def test_a_lost_connection_fails_every_commit_of_the_statement(database_url, db_route):
    """The server ends the connection under a grouped statement: each of its commits gets the
    error (as a single commit would), none is retried alone, and nothing is half-written."""
    if db_route.startswith("pgbouncer"):
        pytest.skip("terminates the server backend directly; PgBouncer would hide which")
    async with grouped_store(database_url) as store:
        await running(store, "wf_gc_head", "wf_gc_l1", "wf_gc_l2", "wf_gc_l3")
        group = store.group_commit
        assert group is not None
        async with held(database_url, "wf_gc_l2"):
            async with held(database_url, "wf_gc_head"):
                head = submitted(store, [commit_of("wf_gc_head")])
                await wait_for(lambda: _waiting(database_url, 1), timeout=30,
                               what="the head commit waiting on the held row")
                batch = submitted(store, [commit_of(run) for run in
                                          ("wf_gc_l1", "wf_gc_l2", "wf_gc_l3")])
                await until_queued(store, 3)
            assert await head[0] is not None
            await wait_for(lambda: _waiting(database_url, 1), timeout=30,
                           what="the grouped statement waiting on the held row")
            await fetchval(database_url, "SELECT pg_terminate_backend(pid) FROM "
                           "pg_stat_activity WHERE datname = current_database() AND "
                           "wait_event_type = 'Lock'")
            results = await asyncio.gather(*batch, return_exceptions=True)
    assert all(isinstance(r, (asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
                              asyncpg.exceptions.OperatorInterventionError, OSError))
               for r in results), results
    assert group.statements == 0
    for run in ("wf_gc_l1", "wf_gc_l2", "wf_gc_l3"):
        assert await checkpoints_of(database_url, run) == []


async def test_a_cancelled_caller_does_not_cancel_its_commit(database_url):
    """Shutdown cancels a waiting caller: its commit still goes out with the statement (like
    a shielded single commit), so a commit is never half-decided by a cancel."""
    async with grouped_store(database_url) as store:
        await running(store, "wf_gc_head", "wf_gc_cancelled")
        async with held(database_url, "wf_gc_head"):
            head = submitted(store, [commit_of("wf_gc_head")])
            await wait_for(lambda: _waiting(database_url, 1), timeout=30,
                           what="the head commit waiting on the held row")
            (caller,) = submitted(store, [commit_of("wf_gc_cancelled")])
            await until_queued(store, 1)
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
        assert await head[0] is not None

        async def landed() -> bool:
            return await checkpoints_of(database_url, "wf_gc_cancelled") == [0]

        await wait_for(landed, timeout=30, what="the cancelled caller's commit written")


async def test_a_batch_of_loads_claims_once_and_answers_each(database_url):
    """Group load: pending runs are claimed (once, even when named twice), running runs are
    read with the state of their last checkpoint, a missing run gives None."""
    async with grouped_store(database_url) as setup:
        await running(setup, "wf_gl_moved")
        assert await setup.commit_phase(commit_of("wf_gl_moved")) is not None
        for workflow_id in ("wf_gl_head", "wf_gl_pending"):
            await setup.start_run(workflow_id=workflow_id, workflow="wf", schema_version=1,
                                  input={"n": 1}, first_phase="a",
                                  message=start_message(workflow_id, "wf", {"n": 1}))
    pool = await create_pool(database_url, min_size=1, max_size=2,
                             pooler=pooler_for(database_url))
    try:
        store = Store(pool, load_window_s=HELD_WINDOW_S)
        async with held(database_url, "wf_gl_head"):
            head = asyncio.ensure_future(store.load_for_phase("wf_gl_head"))
            await wait_for(lambda: _waiting(database_url, 1), timeout=30,
                           what="the head load waiting on the held row")
            batch = [asyncio.ensure_future(store.load_for_phase(workflow_id)) for workflow_id
                     in ("wf_gl_pending", "wf_gl_moved", "wf_gl_missing", "wf_gl_pending")]
            group = store.group_load
            assert group is not None

            async def queued() -> bool:
                return group.queued == 4

            await wait_for(queued, timeout=30, what="4 loads queued behind the held one")
        head_position = await head
        pending, moved, missing, pending_again = await asyncio.gather(*batch)
        assert group.statements == 1
    finally:
        await pool.close()
    assert head_position is not None and head_position.status == "running"
    assert missing is None
    assert pending is not None and pending_again is not None
    assert pending.status == pending_again.status == "running"
    assert json.loads(pending.input_json or "null") == {"n": 1} and pending.next_seq == 0
    assert moved is not None and moved.status == "running" and moved.next_seq == 1
    assert json.loads(moved.state_json or "null") == {"id": "wf_gl_moved"}
    statuses = await fetch(database_url, "SELECT workflow_id, status FROM workflow_runs "
                           "WHERE workflow_id LIKE 'wf_gl_%' ORDER BY 1")
    assert [tuple(r) for r in statuses] == [("wf_gl_head", "running"), ("wf_gl_moved", "running"),
                                            ("wf_gl_pending", "running")]


async def test_a_lone_load_runs_in_its_callers_task_and_a_cancel_hands_its_queue_on(
        database_url):
    """A load with nothing in flight is sent from its caller's task (no flush task: it writes
    nothing a cancel could half-decide). Cancelled while it waits on a held row, the caller
    gets the cancel, and the loads queued behind it go at once, not when the window ends."""
    async with grouped_store(database_url) as setup:
        await running(setup, "wf_gl_behind1", "wf_gl_behind2")
        await setup.start_run(workflow_id="wf_gl_held", workflow="wf", schema_version=1,
                              input={}, first_phase="a",
                              message=start_message("wf_gl_held", "wf", {}))
    pool = await create_pool(database_url, min_size=1, max_size=4,
                             pooler=pooler_for(database_url))
    try:
        store = Store(pool, load_window_s=HELD_WINDOW_S)
        group = store.group_load
        assert group is not None
        async with held(database_url, "wf_gl_held"):
            before = len(asyncio.all_tasks())
            head = asyncio.ensure_future(store.load_for_phase("wf_gl_held"))  # claims: locks
            await wait_for(lambda: _waiting(database_url, 1), timeout=30,
                           what="the lone load waiting on the held row")
            assert len(asyncio.all_tasks()) == before + 1  # the caller's own, nothing else
            behind = [asyncio.ensure_future(store.load_for_phase(workflow_id))
                      for workflow_id in ("wf_gl_behind1", "wf_gl_behind2")]

            async def queued() -> bool:
                return group.queued == 2

            await wait_for(queued, timeout=30, what="2 loads queued behind the lone one")
            head.cancel()
            with pytest.raises(asyncio.CancelledError):
                await head
            # Still inside the held lock: they were sent when the lone load ended.
            positions = await asyncio.wait_for(asyncio.gather(*behind), timeout=30)
        assert [p.workflow_id if p else None for p in positions] == ["wf_gl_behind1",
                                                                     "wf_gl_behind2"]
        assert group.statements == 1
        # Nothing is left in flight: the next lone load goes at once (and claims the run the
        # cancelled one did not).
        claimed = await asyncio.wait_for(store.load_for_phase("wf_gl_held"), timeout=30)
        assert claimed is not None and claimed.status == "running"
    finally:
        await pool.close()


async def test_continued_hops_join_a_group_each_lease_written_per_row(database_url):
    """Local continuation's commits go grouped with the others in one commit_phases
    statement: each continued run's position takes a chain lease for its holder and its own
    seconds, with no outbox row and no outbox id; a stale hop, one of two duplicates and a hop
    of a cancelled run lose only their own row; a plain commit in the same statement writes
    its row and ends the chain its run held, as commit_phase does for one (migration 0020).
    The head hop, sent alone, took the continued hop's own statement (migration 0021) and
    wrote the same lease."""
    async with grouped_store(database_url) as store:
        await running(store, "wf_gc_head", "wf_gc_lease_a", "wf_gc_lease_b", "wf_gc_stale",
                      "wf_gc_dup", "wf_gc_cancelled", "wf_gc_plain")
        # wf_gc_plain's worker was running it locally: its plain commit ends that chain.
        assert await store.commit_phase(commit_of("wf_gc_plain", 0),
                                        lease=Lease("w-old", 600.0)) is not None
        await fetch(database_url, "UPDATE workflow_runs SET status = 'cancelled' "
                    "WHERE workflow_id = 'wf_gc_cancelled'")
        head, results = await behind_a_held_head(
            database_url, store, (commit_of("wf_gc_head"), Lease("w-a", 600.0)), [
                (commit_of("wf_gc_lease_a"), Lease("w-a", 600.0)),
                (commit_of("wf_gc_lease_b"), Lease("w-b", 30.0)),
                (commit_of("wf_gc_stale", seq=3), Lease("w-a", 600.0)),
                (commit_of("wf_gc_dup"), Lease("w-a", 600.0)),
                (commit_of("wf_gc_dup"), Lease("w-b", 600.0)),
                (commit_of("wf_gc_cancelled"), Lease("w-a", 600.0)),
                (commit_of("wf_gc_plain", 1), None)])
        assert head is not None
        lease_a, lease_b, stale, dup_a, dup_b, cancelled, plain = _answers(results)
        assert store.group_commit is not None and store.group_commit.statements == 1
        assert store.group_commit.alone_batches == 0  # a plain commit among them: commit_phases
    assert lease_a is not None and lease_b is not None and lease_a[1] is None
    assert stale is None and cancelled is None
    assert [dup_a is None, dup_b is None].count(True) == 1
    assert plain is not None and plain[1] is not None  # its outbox row, to send
    rows = await fetch(
        database_url, "SELECT workflow_id, seq FROM outbox "
        "WHERE seq > 0 AND workflow_id LIKE 'wf_gc_%' ORDER BY 1")
    assert [tuple(r) for r in rows] == [("wf_gc_plain", 2)]
    chains = await fetch(
        database_url, "SELECT workflow_id, next_seq, chain_holder, "
        "round(extract(epoch FROM chain_until - updated_at))::int AS lease_s, "
        "chain_traceparent FROM run_positions WHERE workflow_id LIKE 'wf_gc_%' ORDER BY 1")
    dup_holder = "w-a" if dup_a is not None else "w-b"
    traceparent = commit_of("wf_gc_head").successor.traceparent  # type: ignore[union-attr]
    assert [tuple(r) for r in chains] == [
        ("wf_gc_dup", 1, dup_holder, 600, traceparent),
        ("wf_gc_head", 1, "w-a", 600, traceparent),
        ("wf_gc_lease_a", 1, "w-a", 600, traceparent),
        ("wf_gc_lease_b", 1, "w-b", 30, traceparent),
        ("wf_gc_plain", 2, None, None, None), ("wf_gc_stale", 0, None, None, None)]
    for workflow_id, seqs in (("wf_gc_dup", [0]), ("wf_gc_stale", []),
                              ("wf_gc_cancelled", []), ("wf_gc_lease_b", [0])):
        assert await checkpoints_of(database_url, workflow_id) == seqs


async def test_a_batch_of_continued_hops_alone_takes_their_own_statement(database_url):
    """Continued hops only (no other commit among them) go as one continue_phases statement
    (migration 0024), each row checked on its own as in commit_phases: each lease written for
    its holder and its seconds, no outbox row; a stale hop, one of two duplicates and a hop of
    a cancelled run lose only their own row."""
    async with grouped_store(database_url) as store:
        await running(store, "wf_ch_head", "wf_ch_a", "wf_ch_b", "wf_ch_stale", "wf_ch_dup",
                      "wf_ch_cancelled")
        await fetch(database_url, "UPDATE workflow_runs SET status = 'cancelled' "
                    "WHERE workflow_id = 'wf_ch_cancelled'")
        head, results = await behind_a_held_head(
            database_url, store, (commit_of("wf_ch_head"), Lease("w-a", 600.0)), [
                (commit_of("wf_ch_a"), Lease("w-a", 600.0)),
                (commit_of("wf_ch_b"), Lease("w-b", 30.0)),
                (commit_of("wf_ch_stale", seq=3), Lease("w-a", 600.0)),
                (commit_of("wf_ch_dup"), Lease("w-a", 600.0)),
                (commit_of("wf_ch_dup"), Lease("w-b", 600.0)),
                (commit_of("wf_ch_cancelled"), Lease("w-a", 600.0))])
        assert head is not None
        hop_a, hop_b, stale, dup_a, dup_b, cancelled = _answers(results)
        group = store.group_commit
        assert group is not None and (group.statements, group.alone_batches) == (1, 1)
    assert hop_a == (hop_a[0], None) and hop_b is not None and hop_b[1] is None  # no outbox id
    assert stale is None and cancelled is None
    assert [dup_a is None, dup_b is None].count(True) == 1
    assert await fetch(database_url, "SELECT workflow_id FROM outbox "
                       "WHERE seq > 0 AND workflow_id LIKE 'wf_ch_%'") == []
    chains = await fetch(
        database_url, "SELECT workflow_id, next_seq, chain_holder, "
        "round(extract(epoch FROM chain_until - updated_at))::int AS lease_s, "
        "chain_traceparent FROM run_positions WHERE workflow_id LIKE 'wf_ch_%' ORDER BY 1")
    traceparent = commit_of("wf_ch_a").successor.traceparent  # type: ignore[union-attr]
    dup_holder = "w-a" if dup_a is not None else "w-b"
    assert [tuple(r) for r in chains] == [
        ("wf_ch_a", 1, "w-a", 600, traceparent), ("wf_ch_b", 1, "w-b", 30, traceparent),
        ("wf_ch_dup", 1, dup_holder, 600, traceparent),
        ("wf_ch_head", 1, "w-a", 600, traceparent), ("wf_ch_stale", 0, None, None, None)]
    for workflow_id, seqs in (("wf_ch_a", [0]), ("wf_ch_dup", [0]), ("wf_ch_stale", []),
                              ("wf_ch_cancelled", [])):
        assert await checkpoints_of(database_url, workflow_id) == seqs


async def test_a_bad_hop_in_a_batch_of_hops_fails_alone(database_url):
    """continue_phases fails as a whole on a state that is not JSON: each hop is committed
    alone in its own statement, so only the bad one raises and its run stays where it was."""
    async with grouped_store(database_url) as store:
        await running(store, "wf_cb_head", "wf_cb_ok", "wf_cb_bad")
        head, (ok, failed) = await behind_a_held_head(
            database_url, store, (commit_of("wf_cb_head"), Lease("w-a", 600.0)), [
                (commit_of("wf_cb_ok"), Lease("w-a", 60.0)),
                (commit_of("wf_cb_bad", state_json='{"not json'), Lease("w-a", 60.0))])
        assert head is not None
        assert store.group_commit is not None and store.group_commit.statements == 0
    assert isinstance(failed, asyncpg.PostgresError)
    assert ok is not None and not isinstance(ok, BaseException) and ok[1] is None
    assert await checkpoints_of(database_url, "wf_cb_ok") == [0]
    assert await checkpoints_of(database_url, "wf_cb_bad") == []
    position = await fetch(database_url, "SELECT workflow_id, next_seq, chain_holder "
                           "FROM run_positions WHERE workflow_id LIKE 'wf_cb_%' ORDER BY 1")
    assert [tuple(r) for r in position] == [("wf_cb_bad", 0, None), ("wf_cb_head", 1, "w-a"),
                                           ("wf_cb_ok", 1, "w-a")]


async def test_a_call_sent_alone_takes_its_own_statement(database_url):
    """A call's ``alone`` form (a continued hop's lean statement) is what goes when the call is
    sent by itself, directly or after a failed multi-row statement; in a batch it is a row of
    the multi-row statement like any other."""
    pool = await create_pool(database_url, min_size=1, max_size=4,
                             pooler=pooler_for(database_url))
    try:
        group = GroupCommit(
            pool, single_sql="SELECT 'single' AS how, $1::int AS n",
            batch_sql="SELECT i, 'batch' AS how, n FROM unnest($1::int[]) "
                      "WITH ORDINALITY AS b(n, i) WHERE 1 / n IS NOT NULL",  # n = 0 fails it
            window_s=HELD_WINDOW_S)
        lean = ("SELECT 'lean' AS how, $1::int + 100 AS n", (1,))
        alone = await group.commit((1,), lean)
        assert alone is not None and (alone["how"], alone["n"]) == ("lean", 101)
        # Three at once: the first goes alone, the other two together behind it.
        first, second, third = await asyncio.gather(
            group.commit((1,), lean), group.commit((2,), ("SELECT 'lean' AS how, 102 AS n",
                                                          ())),
            group.commit((3,)))
        assert first is not None and first["how"] == "lean"
        assert second is not None and (second["how"], second["n"]) == ("batch", 2)
        assert third is not None and (third["how"], third["n"]) == ("batch", 3)
        # A batch that fails as a whole: each call goes alone, in its own form.
        _, fourth, bad = await asyncio.gather(
            group.commit((1,)), group.commit((4,), ("SELECT 'lean' AS how, 104 AS n", ())),
            group.commit((0,)), return_exceptions=True)
        assert not isinstance(fourth, BaseException) and fourth is not None
        assert (fourth["how"], fourth["n"]) == ("lean", 104)
        assert not isinstance(bad, BaseException) and bad is not None
        assert (bad["how"], bad["n"]) == ("single", 0)
    finally:
        await pool.close()


async def test_a_commit_with_a_wait_never_joins_a_group(database_url):
    """A wait (due time, run `waiting`) is commit_phase's alone: with a statement in flight,
    the waiting commit is sent at once by itself, not queued; it lands waiting, its row due
    later and not handed back for sending."""
    async with grouped_store(database_url) as store:
        await running(store, "wf_gc_head", "wf_gc_wait")
        async with held(database_url, "wf_gc_head"):
            head = submitted(store, [commit_of("wf_gc_head")])
            await wait_for(lambda: _waiting(database_url, 1), timeout=30,
                           what="the head commit waiting on the held row")
            waited = await store.commit_phase(replace(commit_of("wf_gc_wait"), wait_s=3600.0))
            assert store.group_commit is not None and store.group_commit.queued == 0
        assert await head[0] is not None
    assert waited is not None and waited[1] is None  # due later: the relay sends it
    run = await fetch(database_url, "SELECT status, due_at > now() AS later FROM workflow_runs "
                      "WHERE workflow_id = 'wf_gc_wait'")
    assert tuple(run[0]) == ("waiting", True)
    row = await fetch(database_url, "SELECT due_at > now() AS later FROM outbox "
                      "WHERE workflow_id = 'wf_gc_wait' AND seq = 1")
    assert row[0]["later"] is True


async def test_a_wait_that_reaches_the_batch_statement_falls_back(database_url):
    """commit_phases refuses a row with a wait; its batch goes to commit_phase one by one, so
    the wait is kept (never silently dropped)."""
    async with grouped_store(database_url) as store:
        await running(store, "wf_gc_fb_wait", "wf_gc_fb_plain")
        group = store.group_commit
        assert group is not None

        def args(commit: PhaseCommit, wait_s: float | None) -> tuple[object, ...]:
            successor = commit.successor
            assert successor is not None
            return (commit.workflow_id, "main", 0, "a", 1, commit.state_json, commit.state_hash,
                    "b", "running", None, None, None, "test", None, successor.dedup_id,
                    successor.group_id, successor.to_json(), None, None, None, None,
                    wait_s, None, None, None, 0.0, None)

        rows = await group._together([args(commit_of("wf_gc_fb_wait"), 3600.0),
                                      args(commit_of("wf_gc_fb_plain"), None)])
    assert all(r is not None and not isinstance(r, BaseException) for r in rows), rows
    assert group.statements == 0
    statuses = await fetch(database_url, "SELECT workflow_id, status FROM workflow_runs "
                           "WHERE workflow_id LIKE 'wf_gc_fb_%' ORDER BY 1")
    assert [tuple(r) for r in statuses] == [("wf_gc_fb_plain", "running"),
                                            ("wf_gc_fb_wait", "waiting")]


async def test_a_batch_of_loads_claims_a_waiting_run_only_for_its_seq(database_url):
    """Group load keeps load_for_phase's waits: a waiting run is claimed by the message of the
    seq it waits for (and gets the signal delivered to that seq), never by a late duplicate."""
    async with grouped_store(database_url) as setup:
        await running(setup, "wf_gl_late", "wf_gl_due")
        await setup.start_run(workflow_id="wf_gl_head", workflow="wf", schema_version=1,
                              input={}, first_phase="a",
                              message=start_message("wf_gl_head", "wf", {}))
        for workflow_id in ("wf_gl_late", "wf_gl_due"):
            assert await setup.commit_phase(
                replace(commit_of(workflow_id), wait_s=3600.0)) is not None
    await fetchval(database_url, "INSERT INTO signals (workflow_id, name, payload, consumed_seq)"
                   " VALUES ('wf_gl_due', 'go', '{\"ok\": true}', 1) RETURNING signal_id")
    # Delivered, as a signal that ends a wait is: the run is due now (signals.sql), so its
    # message may claim it (0036: a waiting run is claimed only once due).
    await fetchval(database_url, "UPDATE workflow_runs SET due_at = now() "
                   "WHERE workflow_id = 'wf_gl_due' RETURNING 1")
    pool = await create_pool(database_url, min_size=1, max_size=2,
                             pooler=pooler_for(database_url))
    try:
        store = Store(pool, load_window_s=HELD_WINDOW_S)
        async with held(database_url, "wf_gl_head"):
            head = asyncio.ensure_future(store.load_for_phase("wf_gl_head", seq=0))
            await wait_for(lambda: _waiting(database_url, 1), timeout=30,
                           what="the head load waiting on the held row")
            batch = [asyncio.ensure_future(store.load_for_phase(workflow_id, seq=seq))
                     for workflow_id, seq in (("wf_gl_late", 0), ("wf_gl_due", 1))]
            group = store.group_load
            assert group is not None

            async def queued() -> bool:
                return group.queued == 2

            await wait_for(queued, timeout=30, what="2 loads queued behind the held one")
        assert await head is not None
        late, due = await asyncio.gather(*batch)
        assert group.statements == 1
    finally:
        await pool.close()
    assert late is not None and late.status == "waiting" and late.signal_json is None
    assert due is not None and due.status == "running" and due.next_seq == 1
    assert json.loads(due.signal_json or "null") == {"ok": True}
    runs = await fetch(database_url, "SELECT workflow_id, status, due_at IS NULL AS cleared "
                       "FROM workflow_runs WHERE workflow_id IN ('wf_gl_late', 'wf_gl_due') "
                       "ORDER BY 1")
    assert [tuple(r) for r in runs] == [("wf_gl_due", "running", True),
                                        ("wf_gl_late", "waiting", False)]
