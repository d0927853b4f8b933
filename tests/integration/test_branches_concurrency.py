"""Two branches committing "last" at the same time against real Postgres: exactly one merge.

The overlap is forced, not hoped for: a third connection holds the fork row lock while both
final commits start; once Postgres shows both waiting on it, the lock is released and they
race for it. Repeated, and also without the hold (plain gathered commits).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg
import pytest

from phasegate.branches import (
    BranchPosition,
    Committed,
    ForkPlan,
    commit_branch,
    commit_fork,
    load_branch,
    plan_fork,
)
from phasegate.envelope import canonical_json, phase_message, start_message, state_hash
from phasegate.store import PhaseCommit, Store
from tests.helpers import fetch, fetchval, store_for, wait_for
from tests.workflows_branches import pair

ROUNDS = 10


@dataclass(frozen=True)
class Forked:
    workflow_id: str
    branches: list[BranchPosition]


def phase_commit(workflow_id: str, branch: str, seq: int, phase: str, state: object,
                 next_phase: str | None) -> PhaseCommit:
    canonical = canonical_json(state)
    return PhaseCommit(workflow_id=workflow_id, branch=branch, seq=seq, phase=phase,
                       schema_version=1, state_json=canonical, state_hash=state_hash(canonical),
                       next_phase=next_phase, status="running", worker_id="test")


async def forked_run(store: Store, workflow_id: str) -> Forked:
    """A `pair` run whose `fork` phase committed: two branches, each one phase from done."""
    await store.start_run(workflow_id=workflow_id, workflow="pair", schema_version=1,
                          input={"x": 1}, first_phase="fork",
                          message=start_message(workflow_id, "pair", None))
    assert await store.load_for_phase(workflow_id) is not None  # pending -> running
    plan: ForkPlan = plan_fork(pair, "fork", 0, "main", [{"i": 0}, {"i": 1}], "join", "all",
                               None)
    envelope = phase_message(workflow_id, "pair", 0, "fork")
    done = await commit_fork(store, phase_commit(workflow_id, "main", 0, "fork", {"x": 1},
                                                 "join"), plan, envelope)
    assert done.committed and len(done.outbox) == 2
    positions = []
    for name in plan.names:
        position = await load_branch(store, workflow_id, name)
        assert position is not None and position.next_seq == 1
        positions.append(position)
    return Forked(workflow_id, positions)


async def finish(store: Store, position: BranchPosition) -> Committed:
    """The branch's one phase (`leg`), committed: its final commit."""
    envelope = phase_message(position.workflow_id, "pair", 1, "leg", position.branch)
    commit = phase_commit(position.workflow_id, position.branch, 1, "leg",
                          {"leg": position.branch}, None)
    return await commit_branch(store, commit, position, envelope, pair)


async def assert_one_merge(database_url: str, run: Forked, results: list[Committed]) -> None:
    assert all(r.committed for r in results)
    assert sorted(r.label for r in results) == ["branch_completed", "fanned_in"]
    merge_rows = [row for r in results for row in r.outbox]
    assert len(merge_rows) == 1 and '"kind":"merge"' in merge_rows[0].body
    outbox = await fetch(database_url, "SELECT branch, seq FROM outbox WHERE workflow_id = $1 "
                         "AND body LIKE '%\"kind\":\"merge\"%'", run.workflow_id)
    assert [tuple(r) for r in outbox] == [("main", 1)]
    fork = await fetch(database_url, "SELECT status, resolution, pending FROM forks "
                       "WHERE workflow_id = $1", run.workflow_id)
    assert [tuple(r) for r in fork] == [("merged", "fan_in", 0)]
    statuses = await fetch(database_url, "SELECT status FROM branches WHERE workflow_id = $1",
                           run.workflow_id)
    assert [r["status"] for r in statuses] == ["merged", "merged"]


async def waiting_on_locks(database_url: str) -> int:
    return int(await fetchval(
        database_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock'"))


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_two_last_branches_released_together_merge_exactly_once(database_url, round_):
    async with store_for(database_url) as first, store_for(database_url) as second:
        run = await forked_run(first, f"wf_pair_held_{round_}")
        holder = await asyncpg.connect(database_url)
        try:
            hold = holder.transaction()
            await hold.start()
            await holder.fetchrow("SELECT 1 FROM forks WHERE workflow_id = $1 FOR UPDATE",
                                  run.workflow_id)
            commits = asyncio.gather(finish(first, run.branches[0]),
                                     finish(second, run.branches[1]))
            await wait_for(lambda: _both_waiting(database_url), timeout=30,
                           what="both final commits waiting on the fork row")
            await hold.rollback()
            results = list(await commits)
        finally:
            await holder.close()
    await assert_one_merge(database_url, run, results)


async def _both_waiting(database_url: str) -> bool:
    return await waiting_on_locks(database_url) == 2


async def test_gathered_last_commits_merge_exactly_once_every_time(database_url):
    async with store_for(database_url) as first, store_for(database_url) as second:
        for round_ in range(ROUNDS):
            run = await forked_run(first, f"wf_pair_free_{round_}")
            results = list(await asyncio.gather(finish(first, run.branches[0]),
                                                finish(second, run.branches[1])))
            await assert_one_merge(database_url, run, results)


async def test_a_duplicate_final_commit_counts_once(database_url):
    """The same branch's last phase committed twice at once (a redelivery): one commit wins,
    the fork counts the branch once, and nothing merges until the sibling finishes."""
    async with store_for(database_url) as first, store_for(database_url) as second:
        run = await forked_run(first, "wf_pair_dup")
        results = await asyncio.gather(finish(first, run.branches[0]),
                                       finish(second, run.branches[0]))
        assert sorted(r.label for r in results) == ["branch_completed", "superseded"]
        assert await fetchval(database_url, "SELECT pending FROM forks") == 1
        last = await finish(first, run.branches[1])
        assert last.label == "fanned_in"
    await assert_one_merge(database_url, run, [r for r in results if r.committed] + [last])
