"""Speculation and steering against real Postgres and SQS: race mode (first to finish, or to
reach a tier, wins; the others' in-flight phases are discarded, never merged), the
supervisor merge, and ``phasegate inspect --tree``."""

from __future__ import annotations

import json

import pytest

from phasegate.orchestrator.control import Control
from phasegate.orchestrator.views import Conflict
from phasegate.store import create_pool
from phasegate.workflow import Registry
from tests.branch_helpers import (  # noqa: F401 (fixtures)
    count,
    discarded_checkpoints,
    inspect_tree,
    main_state,
    open_gate,
    ran,
    settings_fixture,
    start,
)
from tests.helpers import all_done, fetch, queue_for, running_worker, wait_for
from tests.workflows_branches import fanout, speculate

REGISTRY = Registry([fanout, speculate])


async def branch_rows(settings, wid: str) -> dict[str, tuple[str, int | None]]:
    rows = await fetch(settings.database_url, "SELECT branch, status, final_seq FROM branches "
                       "WHERE workflow_id = $1", wid)
    return {r["branch"]: (r["status"], r["final_seq"]) for r in rows}


async def test_race_first_to_finish_wins_and_the_others_are_discarded(settings):
    """s1 runs straight through; s0 and s2 are held inside `attempt`. s1 wins, the merge
    runs with s1 only; then s0 and s2 finish their phase, and their commits are refused and
    recorded as discarded checkpoints."""
    wid = await start(settings, speculate, {"n": 3, "fast": 1, "gate": "race"})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="race resolved")
        assert await ran(settings, "attempt") == 3  # the losers are in flight right now
        await open_gate(settings, "race-0")
        await open_gate(settings, "race-2")
        await wait_for(discarded_checkpoints(settings, wid, 2), what="losers discarded")
    picked = await main_state(settings, wid, "pick")
    assert picked["winners"] == ["f0.s1"]
    assert picked["winner_state"][0]["polished"] is True
    assert await branch_rows(settings, wid) == {
        "f0.s0": ("discarded", None), "f0.s1": ("merged", 2), "f0.s2": ("discarded", None)}
    fork = (await fetch(settings.database_url, "SELECT resolution, winner FROM forks"))[0]
    assert tuple(fork) == ("race", "f0.s1")
    assert await ran(settings, "pick") == 1
    assert await ran(settings, "polish") == 1  # a discarded branch never went on
    discarded = await fetch(settings.database_url, "SELECT branch, seq, phase FROM checkpoints "
                            "WHERE kind = 'discarded' ORDER BY branch")
    assert [tuple(r) for r in discarded] == [("f0.s0", 1, "attempt"), ("f0.s2", 1, "attempt")]
    assert await count(settings, "SELECT count(*) FROM checkpoints WHERE kind = 'phase' "
                       "AND branch IN ('f0.s0', 'f0.s2')") == 0
    assert await count(settings, "SELECT count(*) FROM outbox WHERE body LIKE "
                       "'%\"kind\":\"merge\"%'") == 1


async def test_race_won_by_reaching_the_win_tier_before_finishing(settings):
    """win_tier='good': s1's first phase grades `good`, so s1 wins at once without running
    `polish`; s0 is still held and is discarded."""
    wid = await start(settings, speculate, {"n": 2, "fast": 1, "gate": "tier",
                                            "win_tier": "good", "good_at_attempt": [1]})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="race resolved")
        await open_gate(settings, "tier-0")
        await wait_for(discarded_checkpoints(settings, wid, 1), what="loser discarded")
    assert await branch_rows(settings, wid) == {"f0.s0": ("discarded", None),
                                                "f0.s1": ("merged", 1)}
    picked = await main_state(settings, wid, "pick")
    assert picked["winners"] == ["f0.s1"] and picked["winner_state"][0]["good"] is True
    assert await ran(settings, "polish") == 0
    tier = await fetch(settings.database_url, "SELECT tier, tier_label FROM checkpoints "
                       "WHERE branch = 'f0.s1' AND kind = 'phase'")
    assert [tuple(r) for r in tier] == [(1, "good")]


async def test_supervisor_merge_promotes_a_branch_and_tree_draws_the_dag(settings):
    """Three branches, each held inside `refine` after committing `work`. An operator merges
    f0.b1: its committed state becomes main's checkpoint at the merge seq (recording the
    branch), the merge phase never runs, the run goes on to `publish`; the siblings are
    discarded and their refine results too."""
    wid = await start(settings, fanout, {"n": 3, "gate": "sup", "gated": [0, 1, 2]})
    pool = await create_pool(settings.database_url or "", min_size=1, max_size=2)
    try:
        async with running_worker(settings, REGISTRY), queue_for(settings) as queue:
            await wait_for(lambda: _refining(settings, 3), what="three branches in refine")
            control = Control(pool, queue, REGISTRY, actor="test")
            with pytest.raises(Conflict, match="not a branch of the open fork"):
                await control.merge(wid, "f0.nope")
            outcome = await control.merge(wid, "f0.b1", "b1 looks right")
            assert outcome.action == "merge" and outcome.sent is True
            await wait_for(lambda: all_done(settings.database_url, [wid]), what="published")
            with pytest.raises(Conflict, match="no open fork"):
                await control.merge(wid, "f0.b2")
            for i in range(3):
                await open_gate(settings, f"sup-{i}")
            await wait_for(discarded_checkpoints(settings, wid, 2), what="siblings discarded")
    finally:
        await pool.close()
    promoted = await fetch(settings.database_url, "SELECT seq, phase, source_branch, worker_id, "
                           "state::text AS state FROM checkpoints WHERE branch = 'main' "
                           "AND kind = 'phase' ORDER BY seq")
    assert [(r["seq"], r["phase"], r["source_branch"]) for r in promoted] == [
        (0, "split", None), (1, "combine", "f0.b1"), (2, "publish", None)]
    assert json.loads(promoted[1]["state"]) == {"i": 1, "gate": "sup", "gated": [0, 1, 2],
                                                "worked": 2}
    assert await ran(settings, "combine") == 0
    assert await branch_rows(settings, wid) == {
        "f0.b0": ("discarded", None), "f0.b1": ("merged", 1), "f0.b2": ("discarded", None)}
    action = await fetch(settings.database_url, "SELECT action, reason, actor FROM "
                         "control_actions WHERE workflow_id = $1", wid)
    assert [tuple(r) for r in action] == [("merge", "merge branch f0.b1: b1 looks right",
                                           "test")]
    fork = (await fetch(settings.database_url, "SELECT resolution, winner FROM forks"))[0]
    assert tuple(fork) == ("supervisor", "f0.b1")

    lines = await inspect_tree(settings, "tests.workflows_branches", wid)
    assert lines == [
        f"{wid}  fanout  completed",
        "├── * 0 split  fork all -> combine: supervisor (3/3 done)",
        "│   ├── f0.b0  discarded  1 work, x2 refine",
        "│   ├── f0.b1  merged     1 work  (winner)",
        "│   └── f0.b2  discarded  1 work, x2 refine",
        "├── * 1 combine  <- promoted from f0.b1 (supervisor merge)",
        "└── * 2 publish",
    ]


async def _refining(settings, n: int) -> bool:
    return await ran(settings, "refine") >= n
