"""Fan-out / fan-in against real Postgres and SQS: 1 -> N -> 1, exactly one merge that sees
every branch's final state, also when a worker is SIGKILLed in the middle of the branches."""

from __future__ import annotations

import signal

import pytest

from phasegate.workflow import Registry
from tests.branch_helpers import (  # noqa: F401 (fixtures)
    main_state,
    ran,
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
from tests.workflows_branches import fanout

REGISTRY = Registry([fanout])


async def assert_fanned_in(settings, wid: str, n: int) -> None:
    """Exactly one merge, which saw all n final states in fork order; nothing half-done."""
    url = settings.database_url
    final = await main_state(settings, wid, "combine")
    assert final["branches"] == [f"f0.b{i}" for i in range(n)]
    assert final["values"] == [(i + 1) * 10 for i in range(n)]
    assert final["total"] == sum((i + 1) * 10 for i in range(n))
    assert await ran(settings, "combine") == 1
    merges = await fetch(url, "SELECT seq, branch FROM outbox WHERE workflow_id = $1 "
                         "AND body LIKE '%\"kind\":\"merge\"%'", wid)
    assert [(r["seq"], r["branch"]) for r in merges] == [(1, "main")]
    fork = (await fetch(url, "SELECT status, resolution, pending, branch_count FROM forks "
                        "WHERE workflow_id = $1", wid))[0]
    assert dict(fork) == {"status": "merged", "resolution": "fan_in", "pending": 0,
                          "branch_count": n}
    branches = await fetch(url, "SELECT branch, status, next_seq, final_seq FROM branches "
                           "WHERE workflow_id = $1 ORDER BY ordinal", wid)
    assert [tuple(r) for r in branches] == [(f"f0.b{i}", "merged", 3, 2) for i in range(n)]
    # Every branch: one checkpoint per phase (work at seq 1, refine at seq 2), no more.
    chains = await fetch(url, "SELECT branch, array_agg(seq || ':' || phase ORDER BY seq) AS c "
                         "FROM checkpoints WHERE workflow_id = $1 AND kind = 'phase' "
                         "GROUP BY branch ORDER BY branch", wid)
    assert {r["branch"]: r["c"] for r in chains} == {
        "main": ["0:split", "1:combine", "2:publish"],
        **{f"f0.b{i}": ["1:work", "2:refine"] for i in range(n)}}


async def test_fan_out_fan_in_one_merge_with_every_final_state(settings):
    wid = await start(settings, fanout, {"n": 3})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run completed")
    await assert_fanned_in(settings, wid, 3)
    assert await ran(settings, "work") == 3
    groups = await fetch(settings.database_url, "SELECT DISTINCT group_id FROM outbox "
                         "WHERE workflow_id = $1 ORDER BY 1", wid)
    assert [r["group_id"] for r in groups] == sorted([wid] + [f"{wid}/f0.b{i}"
                                                              for i in range(3)])


@pytest.mark.slow
async def test_one_to_eight_to_one_survives_a_sigkill_mid_branch(settings):
    """The worker process dies (SIGKILL) after its 4th phase -- a branch phase -- before that
    phase's commit. Another worker finishes: exactly one merge, with all 8 states."""
    wid = await start(settings, fanout, {"n": 8})
    victim = spawn_worker(settings, modules="tests.workflows_branches",
                          extra_env={"PHASEGATE_FAULTS": "mid_phase@4",
                                     "PHASEGATE_CONCURRENCY": "8"})
    try:
        assert victim.wait(timeout=60) == -signal.SIGKILL
    finally:
        stop_process(victim)
    killed_in = await fetch(settings.database_url, "SELECT phase, note FROM test_invocations "
                            "ORDER BY id")
    assert killed_in[0]["phase"] == "split" and len(killed_in) >= 4
    assert {r["phase"] for r in killed_in[1:]} <= {"work", "refine"}
    assert await fetchval(settings.database_url, "SELECT status FROM forks") == "open"
    await relay_stranded(settings)  # the kill may have cut the fork's sends short
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), timeout=90,
                       what="run completed after the kill")
    await assert_fanned_in(settings, wid, 8)
    assert await ran(settings, "split") == 1  # the fork was committed once
    assert await ran(settings, "work") + await ran(settings, "refine") > 16
