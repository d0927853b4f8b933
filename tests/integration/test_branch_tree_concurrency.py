"""Nested fan-in under forced overlap, against real Postgres: a third connection holds the
nested fork's row lock while both children's "last" commits (or one final commit and one
failure) start; once Postgres shows both waiting on it, the lock is released. Exactly one
merge message, on the parent branch's chain, never on main."""

from __future__ import annotations

from typing import Any

import pytest

from phasegate.branch_failures import record_failure
from phasegate.branches import BranchPosition, Committed, ForkScope, plan_fork
from phasegate.envelope import phase_message
from phasegate.store import Store
from tests.branch_helpers import (
    NESTED_PARENT,
    commit_a_fork,
    commit_branch_phase,
    load_branches,
    nested_parent,
    released_together,
)
from tests.helpers import fetch, fetchval, store_for
from tests.workflows_tree import nest

ROUNDS = 5
PARENT = NESTED_PARENT


async def nested_run(store: Store, workflow_id: str) -> list[BranchPosition]:
    """A `nest` run: main forked f0.b0, which forked two children, each one phase from done."""
    parent = await nested_parent(store, workflow_id)
    assert parent.depth == 1
    inner = plan_fork(nest, "inner", 1, PARENT, [{"i": 0}, {"i": 1}], "join_inner", "all",
                      None, scope=ForkScope(parent.merge_phase, parent.depth))
    done = await commit_a_fork(store, nest, inner, workflow_id, 1, "inner", {}, None)
    assert done.committed and len(done.outbox) == 2
    children = await load_branches(store, workflow_id, inner.names)
    for child in children:
        assert child.depth == 2 and child.parent_branch == PARENT
    return children


async def finish(store: Store, position: BranchPosition) -> Committed:
    return await commit_branch_phase(store, nest, position, 2, "leg", {"leg": position.branch})


async def fail(store: Store, position: BranchPosition) -> Any:
    envelope = phase_message(position.workflow_id, "nest", 2, "leg", position.branch)
    return await record_failure(store, envelope, "RuntimeError: boom", 0)


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
        results = await released_together(
            database_url, wid, finish(first, children[0]), finish(second, children[1]),
            parent_branch=PARENT, what="both commits waiting on the fork row")
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
        committed, failure = await released_together(
            database_url, wid, finish(first, children[0]), fail(second, children[1]),
            parent_branch=PARENT, what="both commits waiting on the fork row")
    assert committed.committed and failure.status == "failed"
    assert len(committed.outbox) + len(failure.outbox) == 1
    await assert_one_nested_merge(database_url, wid)
    statuses = await fetch(database_url, "SELECT branch, status FROM branches WHERE "
                           "parent_branch = $1 ORDER BY branch", PARENT)
    assert [tuple(r) for r in statuses] == [(f"{PARENT}.f1.b0", "merged"),
                                            (f"{PARENT}.f1.b1", "failed")]
