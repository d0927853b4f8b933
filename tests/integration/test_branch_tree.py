"""Nested branches against real Postgres and SQS: a 3-level fork tree fans in level by level
(every fan-in promotes into its parent branch, the last one into the main chain), exactly one
merge per fork, also when a worker process is SIGKILLed mid-tree; the depth and live-branch
bounds refuse a fork with the reason and write nothing of it."""

from __future__ import annotations

import json
import signal

import pytest

from phasegate.workflow import Registry
from tests.branch_helpers import (  # noqa: F401 (fixtures)
    inspect_tree,
    main_state,
    relay_stranded,
    settings_fixture,
    start,
)
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    running_worker,
    spawn_worker,
    stop_process,
    wait_for,
)
from tests.workflows_tree import leaf_value, tree

MODULES = "tests.workflows_tree"
REGISTRY = Registry([tree])
N = 2  # per fork: 2 level-1, 4 level-2 and 8 level-3 branches, 7 forks


def expected_total(n: int) -> int:
    return sum(leaf_value([a, b, c]) for a in range(n) for b in range(n) for c in range(n))


async def assert_tree_merged(settings, wid: str) -> None:
    """Every fork fanned in once, into its own parent; the run saw every leaf exactly once."""
    url = settings.database_url
    final = await main_state(settings, wid, "join1")
    assert final["value"] == expected_total(N) and final["leaves"] == N ** 3
    assert final["failed"] == []
    forks = await fetch(url, "SELECT parent_branch, fork_seq, status, resolution, pending "
                        "FROM forks WHERE workflow_id = $1 ORDER BY parent_branch", wid)
    assert len(forks) == 1 + N + N * N
    assert {(f["status"], f["resolution"], f["pending"]) for f in forks} == {
        ("merged", "fan_in", 0)}
    # One merge message per fork, on the fork's parent chain at the fork's merge seq.
    merges = await fetch(url, "SELECT branch, seq, count(*) AS n FROM outbox WHERE "
                         "workflow_id = $1 AND body LIKE '%\"kind\":\"merge\"%' "
                         "GROUP BY branch, seq", wid)
    assert sorted((m["branch"], m["seq"]) for m in merges) == sorted(
        (f["parent_branch"], f["fork_seq"] + 1) for f in forks)
    assert {m["n"] for m in merges} == {1}
    # One committed merge checkpoint per fork, on its parent's chain (never on main below 1).
    joins = await fetch(url, "SELECT branch, phase FROM checkpoints WHERE workflow_id = $1 "
                        "AND phase LIKE 'join%' AND kind = 'phase'", wid)
    assert sorted((j["branch"], j["phase"]) for j in joins) == sorted(
        (f["parent_branch"], {0: "join1", 1: "join2", 2: "join3"}[f["fork_seq"]])
        for f in forks)
    depths = await fetch(url, "SELECT depth, count(*) AS n, array_agg(DISTINCT status) AS s "
                         "FROM branches WHERE workflow_id = $1 GROUP BY depth ORDER BY 1", wid)
    assert [(d["depth"], d["n"], d["s"]) for d in depths] == [
        (1, N, ["merged"]), (2, N * N, ["merged"]), (3, N ** 3, ["merged"])]


@pytest.mark.slow
async def test_three_level_tree_survives_sigkills_with_one_merge_per_fork(settings):
    """A worker process is SIGKILLed inside its 6th phase (mid-tree: level-1 and level-2 forks
    committed, leaves running), a second one inside its 9th; a third worker finishes."""
    wid = await start(settings, tree, {"n": N})
    for fault in ("mid_phase@6", "mid_phase@9"):
        victim = spawn_worker(settings, modules=MODULES,
                              extra_env={"PHASEGATE_FAULTS": fault,
                                         "PHASEGATE_CONCURRENCY": "8"})
        try:
            assert victim.wait(timeout=90) == -signal.SIGKILL
        finally:
            stop_process(victim)
        await relay_stranded(settings)  # a kill may cut a fork's sends short
    assert await fetchval(settings.database_url, "SELECT count(*) FROM branches "
                          "WHERE depth >= 2") > 0
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), timeout=120,
                       what="tree completed after the kills")
    await assert_tree_merged(settings, wid)
    lines = await inspect_tree(settings, MODULES, wid)
    print("\n".join(lines))  # the report quotes this tree
    assert lines[0] == f"{wid}  tree  completed"
    assert any("fork@2 all -> join3: fan_in (2/2 done)" in line for line in lines)
    assert sum("merged" in line and "3 leaf" in line for line in lines) == N ** 3


async def test_depth_bound_refuses_the_fork_and_fails_up_the_tree(settings):
    """PHASEGATE_BRANCH_MAX_DEPTH=2: the level-2 branches' forks are refused (ForkError, not
    retried, nothing written); with require="all" that fails each level-2 branch, their
    forks, the level-1 branches, the root fork and the run, with the reason."""
    bounded = settings.model_copy(update={"branch_max_depth": 2})
    wid = await start(bounded, tree, {"n": N, "require": "all"})
    async with running_worker(bounded, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid], "failed"),
                       what="run failed")
    url = settings.database_url
    error = await fetchval(url, "SELECT error FROM workflow_runs WHERE workflow_id = $1", wid)
    assert "PHASEGATE_BRANCH_MAX_DEPTH=2" in error and "ForkError" in error
    assert await fetchval(url, "SELECT count(*) FROM branches WHERE depth > 2") == 0
    assert await fetchval(url, "SELECT count(*) FROM forks WHERE parent_branch LIKE '%.f1.%'") \
        == 0
    assert await fetchval(url, "SELECT count(*) FROM checkpoints WHERE phase = 'l2'") == 0
    assert await fetchval(url, "SELECT count(*) FROM test_invocations WHERE phase = 'leaf'") \
        == 0
    forks = {f["parent_branch"]: f["status"] for f in await fetch(
        url, "SELECT parent_branch, status FROM forks")}
    # The root fork failed; of the level-1 forks, the first to fail failed the run (the other
    # may have been stopped by the run's failure before its own refused fork counted).
    assert forks["main"] == "failed" and "failed" in {forks["f0.b0"], forks["f0.b1"]}


async def test_live_bound_refuses_forks_and_tolerant_forks_merge_the_failures(settings):
    """PHASEGATE_BRANCH_MAX_LIVE=5, one phase at a time: forks are refused once they would
    take the run past 5 live branches; each refused phase fails its branch (ForkError, with
    the setting named), and the tolerant forks above fan in regardless: the merges receive
    the failed branches (status "failed", error type ForkError) and the run completes."""
    bounded = settings.model_copy(update={"branch_max_live": 5, "concurrency": 1})
    wid = await start(bounded, tree, {"n": N})
    async with running_worker(bounded, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run completed")
    url = settings.database_url
    failed = await fetch(url, "SELECT branch, error FROM branches WHERE status = 'failed'")
    assert failed, "some fork must have been refused"
    for row in failed:
        assert row["error"].startswith("ForkError") and "PHASEGATE_BRANCH_MAX_LIVE=5" in \
            row["error"]
    final = await main_state(settings, wid, "join1")
    assert sorted(final["failed"]) == sorted(f"{r['branch']}:ForkError" for r in failed)
    leaves = await fetch(url, "SELECT input FROM branches WHERE depth = 3 AND status = 'merged'")
    assert final["value"] == sum(leaf_value(json.loads(r["input"])["path"]) for r in leaves)
    # Never more than 5 live: every created branch beyond the first level came from a fork
    # that passed the bound, so at most 5 branches exist that did not fail before forking.
    assert await fetchval(url, "SELECT count(*) FROM branches") <= 5 + 2
