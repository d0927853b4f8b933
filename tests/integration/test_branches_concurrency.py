"""Two branches committing "last" at the same time against real Postgres: exactly one merge.

The overlap is forced, not hoped for: a third connection holds the fork row lock while both
final commits start; once Postgres shows both waiting on it, the lock is released and they
race for it. Repeated, and also without the hold (plain gathered commits).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from phasegate.branches import BranchPosition, Committed, ForkPlan, plan_fork
from phasegate.store import Store
from tests.branch_helpers import (
    commit_a_fork,
    commit_branch_phase,
    load_branches,
    released_together,
    started_run,
)
from tests.helpers import fetch, fetchval, store_for
from tests.workflows_branches import pair

ROUNDS = 10


@dataclass(frozen=True)
class Forked:
    workflow_id: str
    branches: list[BranchPosition]


async def forked_run(store: Store, workflow_id: str) -> Forked:
    """A `pair` run whose `fork` phase committed: two branches, each one phase from done."""
    await started_run(store, pair, workflow_id, "fork", {"x": 1})
    plan: ForkPlan = plan_fork(pair, "fork", 0, "main", [{"i": 0}, {"i": 1}], "join", "all",
                               None)
    done = await commit_a_fork(store, pair, plan, workflow_id, 0, "fork", {"x": 1}, "join")
    assert done.committed and len(done.outbox) == 2
    positions = await load_branches(store, workflow_id, plan.names)
    assert all(position.next_seq == 1 for position in positions)
    return Forked(workflow_id, positions)


async def finish(store: Store, position: BranchPosition) -> Committed:
    """The branch's one phase (`leg`), committed: its final commit."""
    return await commit_branch_phase(store, pair, position, 1, "leg", {"leg": position.branch})


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


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_two_last_branches_released_together_merge_exactly_once(database_url, round_):
    async with store_for(database_url) as first, store_for(database_url) as second:
        run = await forked_run(first, f"wf_pair_held_{round_}")
        results = await released_together(
            database_url, run.workflow_id, finish(first, run.branches[0]),
            finish(second, run.branches[1]),
            what="both final commits waiting on the fork row")
    await assert_one_merge(database_url, run, results)


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
