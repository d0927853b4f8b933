"""Nested fan-in under forced overlap, against real Postgres: a third connection holds the
nested fork's row lock while both children's "last" commits (or one final commit and one
failure) start; once Postgres shows both waiting on it, the lock is released. Exactly one
merge message, on the parent branch's chain, never on main."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import asyncpg
import pytest

from phasegate.branch_failures import record_failure
from phasegate.branches import (
    BranchPosition,
    Committed,
    ForkScope,
    commit_branch,
    commit_fork,
    load_branch,
    plan_fork,
)
from phasegate.envelope import phase_message, start_message
from phasegate.store import Store
from tests.helpers import fetch, fetchval, store_for, wait_for
from tests.integration.test_branches_concurrency import phase_commit, waiting_on_locks
from tests.workflows_tree import nest

ROUNDS = 5
PARENT = "f0.b0"


async def nested_run(store: Store, workflow_id: str) -> list[BranchPosition]:
    """A `nest` run: main forked f0.b0, which forked two children, each one phase from done."""
    await store.start_run(workflow_id=workflow_id, workflow="nest", schema_version=1,
                          input={}, first_phase="outer",
                          message=start_message(workflow_id, "nest", None))
    assert await store.load_for_phase(workflow_id) is not None
    outer = plan_fork(nest, "outer", 0, "main", [{"o": 0}], "join_outer", "all", None)
    done = await commit_fork(store, phase_commit(workflow_id, "main", 0, "outer", {}, None),
                             outer, phase_message(workflow_id, "nest", 0, "outer"))
    assert done.committed
    parent = await load_branch(store, workflow_id, PARENT)
    assert parent is not None and parent.depth == 1
    inner = plan_fork(nest, "inner", 1, PARENT, [{"i": 0}, {"i": 1}], "join_inner", "all",
                      None, scope=ForkScope(parent.merge_phase, parent.depth))
    done = await commit_fork(store, phase_commit(workflow_id, PARENT, 1, "inner", {}, None),
                             inner, phase_message(workflow_id, "nest", 1, "inner", PARENT))
    assert done.committed and len(done.outbox) == 2
    children = []
    for name in inner.names:
        child = await load_branch(store, workflow_id, name)
        assert child is not None and child.depth == 2 and child.parent_branch == PARENT
        children.append(child)
    return children


async def finish(store: Store, position: BranchPosition) -> Committed:
    envelope = phase_message(position.workflow_id, "nest", 2, "leg", position.branch)
    commit = phase_commit(position.workflow_id, position.branch, 2, "leg",
                          {"leg": position.branch}, None)
    return await commit_branch(store, commit, position, envelope, nest)


async def fail(store: Store, position: BranchPosition) -> Any:
    envelope = phase_message(position.workflow_id, "nest", 2, "leg", position.branch)
    return await record_failure(store, envelope, "RuntimeError: boom", 0)


async def held(database_url: str, workflow_id: str, *commits: Awaitable[Any]) -> list[Any]:
    holder = await asyncpg.connect(database_url)
    try:
        hold = holder.transaction()
        await hold.start()
        await holder.fetchrow("SELECT 1 FROM forks WHERE workflow_id = $1 AND "
                              "parent_branch = $2 FOR UPDATE", workflow_id, PARENT)
        gathered = asyncio.gather(*commits)

        async def both_waiting() -> bool:
            return await waiting_on_locks(database_url) == 2

        await wait_for(both_waiting, timeout=30, what="both commits waiting on the fork row")
        await hold.rollback()
        return list(await gathered)
    finally:
        await holder.close()


async def assert_one_nested_merge(database_url: str, workflow_id: str) -> None:
    merges = await fetch(database_url, "SELECT branch, seq FROM outbox WHERE workflow_id = $1 "
                         "AND body LIKE '%\"kind\":\"merge\"%'", workflow_id)
    assert [tuple(r) for r in merges] == [(PARENT, 2)]
    forks = await fetch(database_url, "SELECT parent_branch, status, resolution, pending "
                        "FROM forks WHERE workflow_id = $1 ORDER BY parent_branch", workflow_id)
    assert [tuple(r) for r in forks] == [(PARENT, "merged", "fan_in", 0),
                                         ("main", "open", None, 1)]


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_two_last_children_released_together_merge_once_into_the_parent(database_url,
                                                                              round_):
    wid = f"wf_nest_held_{round_}"
    async with store_for(database_url) as first, store_for(database_url) as second:
        children = await nested_run(first, wid)
        results = await held(database_url, wid, finish(first, children[0]),
                             finish(second, children[1]))
    assert sorted(r.label for r in results) == ["branch_completed", "fanned_in"]
    await assert_one_nested_merge(database_url, wid)
    assert await fetchval(database_url, "SELECT status FROM branches WHERE branch = $1",
                          PARENT) == "running"


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_a_failure_and_a_final_commit_released_together_merge_once(database_url, round_):
    """One child fails for good while its sibling commits its last phase: whichever takes the
    lock second fans in; the merge message is written once, the failure is counted once."""
    wid = f"wf_nest_fail_{round_}"
    async with store_for(database_url) as first, store_for(database_url) as second:
        children = await nested_run(first, wid)
        committed, failure = await held(database_url, wid, finish(first, children[0]),
                                        fail(second, children[1]))
    assert committed.committed and failure.status == "failed"
    assert len(committed.outbox) + len(failure.outbox) == 1
    await assert_one_nested_merge(database_url, wid)
    statuses = await fetch(database_url, "SELECT branch, status FROM branches WHERE "
                           "parent_branch = $1 ORDER BY branch", PARENT)
    assert [tuple(r) for r in statuses] == [(f"{PARENT}.f1.b0", "merged"),
                                            (f"{PARENT}.f1.b1", "failed")]
