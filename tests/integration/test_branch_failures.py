"""Failure-tolerant branches and supervisor review against real Postgres and SQS: a race
goes on when branches fail and is won by the last one standing; a fan-in hands failed
branches to the merge; require="all" keeps the old strictness; a merge phase rejects a branch
twice (a new input, then the same) and accepts it the third time; a review past its budget
fails the run with the reason."""

from __future__ import annotations

from phasegate.orchestrator.branching import supervisor_merge
from phasegate.store import create_pool
from phasegate.workflow import Registry
from tests.branch_helpers import (  # noqa: F401 (fixtures)
    branch_statuses,
    inspect_tree,
    main_states,
    open_gate,
    settings_fixture,
    start,
)
from tests.helpers import all_done, fetch, fetchval, running_worker, wait_for
from tests.workflows_tree import flaky, inner_review, review

MODULES = "tests.workflows_tree"
REGISTRY = Registry([flaky, review])


async def test_race_where_two_of_three_fail_is_won_by_the_third(settings):
    """s0 and s1 fail (not retryable); s2 is held until both failures are recorded, so the
    race provably goes on after them; then s2 wins and the merge sees the failures."""
    wid = await start(settings, flaky, {"n": 3, "fail": [0, 1], "gate": "r"})
    url = settings.database_url
    async with running_worker(settings, REGISTRY):
        async def two_failed() -> bool:
            return await fetchval(url, "SELECT count(*) FROM branches WHERE status = 'failed'") \
                == 2
        await wait_for(two_failed, what="two branches failed")
        assert await fetchval(url, "SELECT status FROM workflow_runs") == "running"
        fork = (await fetch(url, "SELECT status, pending FROM forks"))[0]
        assert (fork["status"], fork["pending"]) == ("open", 1)
        await open_gate(settings, "r-2")
        await wait_for(lambda: all_done(url, [wid]), what="race won")
    [picked] = await main_states(settings, wid, "pick")
    assert picked["won"] == ["f0.b2"] and picked["results"] == [14]
    assert picked["failed"] == {"f0.b0": "NonRetryableError", "f0.b1": "NonRetryableError"}
    assert await branch_statuses(settings, wid) == {"f0.b0": "failed", "f0.b1": "failed",
                                                    "f0.b2": "merged"}
    fork = (await fetch(url, "SELECT status, resolution, winner FROM forks"))[0]
    assert tuple(fork) == ("merged", "race", "f0.b2")


async def test_race_where_every_branch_fails_fails_the_run(settings):
    wid = await start(settings, flaky, {"n": 3, "fail": [0, 1, 2]})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid], "failed"),
                       what="run failed")
    error = await fetchval(settings.database_url, "SELECT error FROM workflow_runs")
    assert error.startswith("every branch of the race at main seq 0 failed")
    assert await fetchval(settings.database_url, "SELECT count(*) FROM checkpoints "
                          "WHERE phase = 'pick'") == 0
    assert await fetchval(settings.database_url, "SELECT status FROM forks") == "failed"


async def test_fan_in_hands_failed_branches_to_the_merge(settings):
    wid = await start(settings, flaky, {"n": 3, "fail": [1], "mode": "all"})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run completed")
    [picked] = await main_states(settings, wid, "pick")
    assert picked["won"] == ["f0.b0", "f0.b2"] and picked["results"] == [0, 14]
    assert picked["failed"] == {"f0.b1": "NonRetryableError"}
    assert await branch_statuses(settings, wid) == {"f0.b0": "merged", "f0.b1": "failed",
                                                    "f0.b2": "merged"}


async def test_require_all_fails_the_run_on_one_failed_branch(settings):
    wid = await start(settings, flaky, {"n": 3, "fail": [1], "mode": "all",
                                        "require": "all", "fail_gate": "strict"})
    async with running_worker(settings, REGISTRY):
        async def two_completed() -> bool:
            return await fetchval(settings.database_url, "SELECT count(*) FROM branches "
                                  "WHERE status = 'completed'") == 2
        await wait_for(two_completed, what="f0.b0 and f0.b2 completed")
        await open_gate(settings, "strict-1")
        await wait_for(lambda: all_done(settings.database_url, [wid], "failed"),
                       what="run failed")
    error = await fetchval(settings.database_url, "SELECT error FROM workflow_runs")
    assert error.startswith("branch f0.b1 failed (the fork requires all): NonRetryableError")
    assert await fetchval(settings.database_url, "SELECT count(*) FROM checkpoints "
                          "WHERE phase = 'pick'") == 0
    # An operator can still rescue the failed run from a branch that finished.
    pool = await create_pool(settings.database_url or "", min_size=1, max_size=2)
    try:
        assert await supervisor_merge(pool, None, wid, "f0.b2", "b2 is fine", "ops") is None
    finally:
        await pool.close()
    assert await fetchval(settings.database_url, "SELECT status FROM workflow_runs") == \
        "completed"
    assert await fetchval(settings.database_url, "SELECT source_branch FROM checkpoints "
                          "WHERE branch = 'main' AND phase = 'pick'") == "f0.b2"


async def test_merge_rejects_a_branch_twice_then_accepts_it(settings):
    """Round 1 retries f0.b1 with a new input, round 2 with the same one, round 3 accepts it
    and discards f0.b2. Each attempt of f0.b1 has its own seqs and checkpoints; the merge
    phase is checkpointed per round and the run goes on to `finish` once."""
    wid = await start(settings, review, {})
    url = settings.database_url
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(url, [wid]), what="run completed")
    rounds = await main_states(settings, wid, "judge")
    assert [r["rounds"] for r in rounds] == [1, 2, 3]
    final = rounds[-1]
    assert final["scores"] == {"f0.b0": 10, "f0.b1": 40}
    assert final["inputs"]["f0.b1"] == {"x": 4} and final["retries"]["f0.b1"] == 2
    assert (await main_states(settings, wid, "finish"))[0]["finished"] is True
    chains = await fetch(url, "SELECT branch, array_agg(seq || ':' || phase ORDER BY seq) AS c "
                         "FROM checkpoints WHERE workflow_id = $1 AND kind = 'phase' "
                         "GROUP BY branch", wid)
    assert {r["branch"]: r["c"] for r in chains} == {
        "main": ["0:ask", "1:judge", "2:judge", "3:judge", "4:finish"],
        "f0.b0": ["1:draft"], "f0.b1": ["1:draft", "3:draft", "5:draft"],
        "f0.b2": ["1:draft"]}
    assert await branch_statuses(settings, wid) == {"f0.b0": "merged", "f0.b1": "merged",
                                                    "f0.b2": "discarded"}
    fork = (await fetch(url, "SELECT status, resolution, retries, merge_seq FROM forks"))[0]
    assert tuple(fork) == ("merged", "fan_in", 2, 3)
    merges = await fetch(url, "SELECT seq FROM outbox WHERE body LIKE '%\"kind\":\"merge\"%' "
                         "ORDER BY seq")
    assert [m["seq"] for m in merges] == [1, 2, 3]  # one fan-in per round
    lines = await inspect_tree(settings, MODULES, wid)
    print("\n".join(lines))
    assert lines[1:] == [
        "├── * 0 ask  fork all -> judge: fan_in (3/3 done)",
        "│   ├── f0.b0  merged     1 draft",
        "│   ├── f0.b1  merged     1 draft, 3 draft, 5 draft  r2",
        "│   └── f0.b2  discarded  1 draft",
        "├── * 1 judge  (review round: branches sent round again)",
        "├── * 2 judge  (review round: branches sent round again)",
        "├── * 3 judge  <- merge of f0.b0, f0.b1; retried 2",
        "└── * 4 finish",
    ]


async def test_review_past_its_budget_fails_the_run_with_the_reason(settings):
    wid = await start(settings, review, {"budget": 1})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid], "failed"),
                       what="run failed")
    error = await fetchval(settings.database_url, "SELECT error FROM workflow_runs")
    assert error.startswith("ForkError: ctx.review_branches: 1 retries asked, the fork's "
                            "budget has 0 left")
    assert [r["rounds"] for r in await main_states(settings, wid, "judge")] == [1]


async def test_a_review_inside_a_branch_retries_a_child_and_merges_into_the_branch(settings):
    """The nested merge (in branch f0.a) discards one child and retries the other with a new
    input; its second round merges into f0.a, which then fans in to main."""
    wid = await start(settings, inner_review, {})
    url = settings.database_url
    async with running_worker(settings, Registry([inner_review])):
        await wait_for(lambda: all_done(url, [wid]), what="run completed")
    [closed] = await main_states(settings, wid, "close")
    assert closed == {"inner": {"round": 2, "xs": [5]}}
    chains = await fetch(url, "SELECT branch, array_agg(seq || ':' || phase ORDER BY seq) AS c "
                         "FROM checkpoints WHERE workflow_id = $1 AND kind = 'phase' "
                         "GROUP BY branch", wid)
    assert {r["branch"]: r["c"] for r in chains} == {
        "main": ["0:top", "1:close"], "f0.a": ["1:spread", "2:judge_inner", "3:judge_inner"],
        "f0.a.f1.b0": ["2:try"], "f0.a.f1.b1": ["2:try", "4:try"]}
    assert await branch_statuses(settings, wid) == {"f0.a": "merged", "f0.a.f1.b0": "discarded",
                                                    "f0.a.f1.b1": "merged"}
