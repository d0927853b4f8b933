"""Tiers, upcasters, the versions report and the staleness envelope, without servers."""

from __future__ import annotations

from typing import Any

import pytest

from phasegate import Context, Registry, Workflow, WorkflowDefinitionError
from phasegate.staleness import Observations, StalenessError, approved, check, review_for
from phasegate.tiers import Grade, decide, grade
from phasegate.versions import NeedsRestart, build_report, format_report, restart_gate, upcast


def level(n: int) -> Any:
    return lambda state: state.get("level", 0) >= n


def tiered(below: str = "retry", retries: int = 1) -> Workflow:
    wf = Workflow("t", tiers=[("a", level(1)), ("b", level(2)), ("c", level(3))])

    @wf.phase("one", expect_tier="b", below_tier=below, max_tier_retries=retries)
    async def one(ctx: Context, state: Any) -> Any:
        return state

    @wf.phase("two")
    async def two(ctx: Context, state: Any) -> Any:
        return state

    return wf


async def test_grade_is_the_highest_consecutive_passing_tier():
    wf = Workflow("g", tiers=[("a", level(1)), ("b", lambda s: False), ("c", level(0))])
    assert await grade(wf.tiers, {"level": 5}) == Grade(1, "a")
    assert await grade(wf.tiers, {"level": 0}) == Grade(0, None)
    assert await grade([], {}) is None


async def test_below_tier_policies_decide_where_the_run_goes():
    wf = tiered("retry", retries=1)
    one = wf.phases[0]
    low, ok = Grade(1, "a"), Grade(2, "b")
    assert decide(wf, one, 4, ok, 1, None).action == "advance"
    retry = decide(wf, one, 4, low, 1, None)
    assert (retry.action, retry.next_phase, retry.status) == ("retry", "one", "running")
    spent = decide(wf, one, 5, low, 2, 4)
    assert (spent.action, spent.status, spent.next_phase) == ("escalate", "awaiting_review", "two")
    assert spent.reason is not None and "after 2 attempts" in spent.reason
    assert spent.review is not None and spent.review["first_seq"] == 4
    advance = decide(tiered("advance"), tiered("advance").phases[0], 0, low, 1, None)
    assert advance.action == "advance" and advance.tier == 1


def test_tier_policy_definition_errors():
    with pytest.raises(WorkflowDefinitionError, match="no tiers"):
        Workflow("x").phase("p", expect_tier="a")
    wf = Workflow("x", tiers=[("a", level(1))])
    with pytest.raises(WorkflowDefinitionError, match="unknown tier"):
        wf.phase("p", expect_tier="zz")
    with pytest.raises(WorkflowDefinitionError, match="below_tier"):
        wf.phase("p", expect_tier="a", below_tier="ignore")
    with pytest.raises(WorkflowDefinitionError, match="declared twice"):
        Workflow("y", tiers=[("a", level(1)), ("a", level(2))])


async def test_upcasters_chain_and_gaps_need_a_restart():
    wf = Workflow("u", schema_version=3)

    @wf.upcast(from_version=1)
    def one_to_two(state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "two": True}

    @wf.upcast(from_version=2)
    async def two_to_three(state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "three": True}

    assert await upcast(wf, {"x": 1}, 1) == {"x": 1, "two": True, "three": True}
    with pytest.raises(NeedsRestart, match="rollback"):
        await upcast(wf, {}, 4)
    gap = Workflow("g", schema_version=3)
    gap.upcast(from_version=2)(lambda s: s)
    with pytest.raises(NeedsRestart, match="no upcaster from version 1"):
        await upcast(gap, {}, 1)
    with pytest.raises(WorkflowDefinitionError, match="from_version"):
        gap.upcast(from_version=3)


def test_versions_report_classifies_runs_as_a_worker_would():
    wf = Workflow("w", schema_version=3)
    wf.upcast(from_version=2)(lambda s: s)
    wf.phase("p")(_noop)
    report = build_report([("w", True, None, 4), ("w", False, 3, 2), ("w", False, 2, 1),
                           ("w", False, 1, 5), ("gone", False, 1, 1)], Registry([wf]))
    rows = {r.workflow: r for r in report}
    assert (rows["w"].recoverable, rows["w"].upcastable, rows["w"].needs_restart) == (6, 1, 5)
    assert rows["gone"].needs_restart == 1 and rows["gone"].note
    text = format_report(report)
    assert "needs_restart" in text and "not in the loaded" in text


def test_restart_gate_refuses_above_the_share_and_names_the_workflows():
    wf = Workflow("w", schema_version=3)
    wf.phase("p")(_noop)
    # 6 recoverable (input or v3), 5 at v1 with no upcaster, 1 of a workflow no longer loaded.
    report = build_report([("w", True, None, 4), ("w", False, 3, 2), ("w", False, 1, 5),
                           ("gone", False, 1, 1)], Registry([wf]))
    refusal = restart_gate(report, 0.25)
    assert refusal is not None
    assert refusal.startswith("6 of 12 unfinished runs (50.0%)")
    assert "w (5 of 11)" in refusal and "gone (1 of 1)" in refusal
    assert restart_gate(report, 0.5) is None, "exactly at the share is allowed"
    assert restart_gate([], 0.0) is None, "no unfinished runs: nothing to refuse"


async def _noop(ctx: Context, state: Any) -> Any:
    return state


async def test_observe_needs_a_fetcher_and_keeps_the_first_version_per_phase():
    wf = Workflow("s")
    with pytest.raises(StalenessError, match="no version fetcher"):
        Observations(wf).observe("d1", "doc", "v1")
    wf.version_fetcher("doc")(lambda rid: "v2")
    seen = Observations(wf, [{"type": "doc", "id": "d0", "version": "v0"}])
    seen.observe("d1", "doc", "v1")
    seen.observe("d1", "doc", "v9")
    assert seen.resources == [{"type": "doc", "id": "d0", "version": "v0"},
                              {"type": "doc", "id": "d1", "version": "v1"}]


async def test_changed_and_unknown_versions_are_stale_and_approval_takes_the_new_ones():
    wf = Workflow("s")

    @wf.version_fetcher()
    async def current(resource_id: str) -> str:
        if resource_id == "down":
            raise TimeoutError("version service timed out")
        return "v2"

    resources = [{"type": "doc", "id": "same", "version": "v2"},
                 {"type": "doc", "id": "moved", "version": "v1"},
                 {"type": "doc", "id": "down", "version": "v1"}]
    stale = await check(wf, resources)
    assert {(s.resource_id, s.current) for s in stale} == {("moved", "v2"), ("down", None)}
    reason, review = review_for(stale, 3, "write")
    assert reason.startswith("stale_resources: ") and "unknown: TimeoutError" in reason
    assert [r["version"] for r in approved(resources, review)] == ["v2", "v2", "v1"]
