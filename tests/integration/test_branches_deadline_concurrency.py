"""A race's deadline and its winner committing at the same instant, against real Postgres.

The overlap is forced, not hoped for: a third connection holds the fork row lock; the
winner's final commit and the deadline's statement queue on it one after the other (Postgres
shows each waiting), then the lock is released and they run in the order they queued. Both
orders, repeated: either the race is won and the deadline changes nothing, or the deadline
ends it and the winner's commit is refused -- never both, never neither. A deadline message
that comes early, twice, or names no fork changes nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from phasegate.branches import BranchPosition, Committed, ForkPlan, ForkScope, plan_fork
from phasegate.envelope import Envelope, phase_message
from phasegate.race_deadline import Expired, expire
from phasegate.store import Store
from tests.branch_helpers import (
    NESTED_PARENT,
    commit_a_fork,
    commit_branch_phase,
    fork_row_locked,
    load_branches,
    nested_parent,
    started_run,
    wait_until_waiting,
)
from tests.helpers import fetch, fetchval, store_for, wait_for
from tests.workflows_branch_doors import timed_race
from tests.workflows_tree import nest

ROUNDS = 5


async def raced(store: Store, workflow_id: str, deadline_s: float) -> list[BranchPosition]:
    """A `timed-race` run whose `launch` committed a race of two branches, each one phase
    (`search`) from done."""
    await started_run(store, timed_race, workflow_id, "launch", {})
    plan: ForkPlan = plan_fork(timed_race, "launch", 0, "main", [{"i": 0}, {"i": 1}],
                               "settle", "race", None, deadline_s=deadline_s)
    done = await commit_a_fork(store, timed_race, plan, workflow_id, 0, "launch", {}, "settle")
    assert done.committed and len(done.outbox) == 2  # the deadline row is not sent now
    return await load_branches(store, workflow_id, plan.names)


def deadline(workflow_id: str) -> Envelope:
    return phase_message(workflow_id, "timed-race", 0, "settle").model_copy(
        update={"kind": "deadline"})


async def win(store: Store, position: BranchPosition) -> Committed:
    return await commit_branch_phase(store, timed_race, position, 1, "search",
                                     {"found": position.branch})


async def due(database_url: str, workflow_id: str) -> bool:
    return bool(await fetchval(database_url, "SELECT deadline_at <= now() FROM forks "
                               "WHERE workflow_id = $1", workflow_id))


async def queued_in_order(database_url: str, workflow_id: str,
                          first: Callable[[], Awaitable[Any]],
                          second: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Hold the fork row; start `first`, wait until it waits on the lock, then `second`;
    release: Postgres grants the row to the waiters in the order they queued."""
    async with fork_row_locked(database_url, workflow_id) as release:
        one = asyncio.ensure_future(first())
        await wait_until_waiting(database_url, 1, "first waiting")
        two = asyncio.ensure_future(second())
        await wait_until_waiting(database_url, 2, "both waiting")
        await release()
        return [await one, await two]


async def state_of(database_url: str, workflow_id: str) -> dict[str, Any]:
    run = (await fetch(database_url, "SELECT status, error FROM workflow_runs "
                       "WHERE workflow_id = $1", workflow_id))[0]
    fork = (await fetch(database_url, "SELECT status, resolution, winner FROM forks "
                        "WHERE workflow_id = $1", workflow_id))[0]
    branches = await fetch(database_url, "SELECT branch, status FROM branches "
                           "WHERE workflow_id = $1 ORDER BY branch", workflow_id)
    merges = await fetchval(database_url, "SELECT count(*) FROM outbox WHERE workflow_id = $1 "
                            "AND body LIKE '%\"kind\":\"merge\"%'", workflow_id)
    return {"run": run["status"], "error": run["error"], "fork": tuple(fork),
            "branches": {b["branch"]: b["status"] for b in branches}, "merges": merges}


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_winner_queued_first_wins_and_the_deadline_changes_nothing(database_url,
                                                                         round_):
    async with store_for(database_url) as first, store_for(database_url) as second:
        wid = f"wf_dl_win_{round_}"
        branches = await raced(first, wid, 0.2)
        await wait_for(lambda: due(database_url, wid), what="deadline passed (database time)")
        won, ended = await queued_in_order(database_url, wid,
                                           lambda: win(first, branches[1]),
                                           lambda: expire(second, deadline(wid)))
    assert isinstance(won, Committed) and (won.committed, won.label) == (True, "race_won")
    assert isinstance(ended, Expired) and ended.reason is None
    assert ended.label == "deadline_moot"
    assert await state_of(database_url, wid) == {
        "run": "running", "error": None, "fork": ("merged", "race", "f0.b1"),
        "branches": {"f0.b0": "discarded", "f0.b1": "merged"}, "merges": 1}


@pytest.mark.parametrize("round_", range(ROUNDS))
async def test_deadline_queued_first_ends_the_race_and_refuses_the_winner(database_url,
                                                                          round_):
    async with store_for(database_url) as first, store_for(database_url) as second:
        wid = f"wf_dl_end_{round_}"
        branches = await raced(first, wid, 0.2)
        await wait_for(lambda: due(database_url, wid), what="deadline passed (database time)")
        ended, won = await queued_in_order(database_url, wid,
                                           lambda: expire(second, deadline(wid)),
                                           lambda: win(first, branches[1]))
    assert isinstance(ended, Expired) and ended.label == "failed" and ended.discarded == 2
    assert isinstance(won, Committed) and (won.committed, won.label) == (False, "discarded")
    assert await state_of(database_url, wid) == {
        "run": "failed", "fork": ("failed", "deadline", None), "merges": 0,
        "error": "RaceDeadlineExceeded: no branch of the race at main seq 0 won within its "
                 "deadline of 0.2 s",
        "branches": {"f0.b0": "discarded", "f0.b1": "discarded"}}
    # What the refused winner produced is kept, as a discarded checkpoint, never merged.
    assert await fetchval(database_url, "SELECT count(*) FROM checkpoints WHERE workflow_id = "
                          "$1 AND branch = 'f0.b1' AND kind = 'discarded'", wid) == 1


async def test_gathered_winner_and_deadline_decide_exactly_one_way(database_url):
    async with store_for(database_url) as first, store_for(database_url) as second:
        for round_ in range(ROUNDS):
            wid = f"wf_dl_free_{round_}"
            branches = await raced(first, wid, 0.2)
            await wait_for(lambda w=wid: due(database_url, w), what="deadline passed")
            won, ended = await asyncio.gather(win(first, branches[0]),
                                              expire(second, deadline(wid)))
            state = await state_of(database_url, wid)
            assert won.committed != (ended.reason is not None)
            assert state["run"] == ("running" if won.committed else "failed")
            assert state["merges"] == (1 if won.committed else 0)


async def test_early_repeated_or_unknown_deadline_messages_change_nothing(database_url):
    async with store_for(database_url) as store:
        await raced(store, "wf_dl_early", 3600)
        early = await expire(store, deadline("wf_dl_early"))
        assert (early.reason, early.label) == (None, "deadline_moot")
        assert (await state_of(database_url, "wf_dl_early"))["fork"] == ("open", None, None)
        unknown = await expire(store, deadline("wf_dl_nothing"))
        assert unknown.reason is None
        await raced(store, "wf_dl_twice", 0.2)
        await wait_for(lambda: due(database_url, "wf_dl_twice"), what="deadline passed")
        assert (await expire(store, deadline("wf_dl_twice"))).label == "failed"
        assert (await expire(store, deadline("wf_dl_twice"))).label == "deadline_moot"
    assert (await state_of(database_url, "wf_dl_twice"))["run"] == "failed"


async def test_a_nested_race_deadline_fails_its_parent_branch_and_the_fork_above_fans_in(
        database_url):
    """The race forked inside branch f0.b0 (its only sibling fork above is a tolerant `all`)
    runs out of time: its children are discarded, f0.b0 fails with the deadline error, and
    the fork above counts that failure -- it fans in, writing main's merge message."""
    wid = "wf_dl_nested"
    parent = NESTED_PARENT
    async with store_for(database_url) as store:
        position = await nested_parent(store, wid)
        inner = plan_fork(nest, "inner", 1, parent, [{"i": 0}, {"i": 1}], "join_inner",
                          "race", None, scope=ForkScope(position.merge_phase, position.depth),
                          deadline_s=0.2)
        assert (await commit_a_fork(store, nest, inner, wid, 1, "inner", {}, None)).committed
        await wait_for(lambda: due_nested(database_url, wid, parent), what="deadline passed")
        message = phase_message(wid, "nest", 1, "join_inner", parent).model_copy(
            update={"kind": "deadline"})
        ended = await expire(store, message)
    assert ended.label == "race_deadline" and ended.discarded == 2
    assert [json.loads(r.body)["kind"] for r in ended.outbox] == ["merge"]
    forks = await fetch(database_url, "SELECT parent_branch, status, resolution FROM forks "
                        "WHERE workflow_id = $1 ORDER BY parent_branch", wid)
    assert [tuple(r) for r in forks] == [(parent, "failed", "deadline"),
                                         ("main", "merged", "fan_in")]
    rows = await fetch(database_url, "SELECT branch, status, error FROM branches "
                       "WHERE workflow_id = $1 ORDER BY branch", wid)
    assert [(r["branch"], r["status"]) for r in rows] == [
        (parent, "failed"), (f"{parent}.f1.b0", "discarded"), (f"{parent}.f1.b1", "discarded")]
    assert rows[0]["error"] == ("RaceDeadlineExceeded: no branch of the race at f0.b0 seq 1 "
                                "won within its deadline of 0.2 s")
    assert await fetchval(database_url, "SELECT status FROM workflow_runs") == "running"


async def due_nested(database_url: str, workflow_id: str, parent: str) -> bool:
    return bool(await fetchval(database_url, "SELECT deadline_at <= now() FROM forks WHERE "
                               "workflow_id = $1 AND parent_branch = $2", workflow_id, parent))
