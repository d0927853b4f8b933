"""ctx.fork's checks and branch names (nested too), ctx.review_branches' checks, and the
--tree drawing, without servers."""

from __future__ import annotations

from typing import Any

import pytest

from phasegate import BranchResult, Context, Retry
from phasegate.branch_review import MergedBranches
from phasegate.branches import ForkError, ForkScope, plan_fork
from phasegate.orchestrator.render_tree import tree
from tests.workflows_branches import fanout, speculate
from tests.workflows_tree import tree as tree_wf


def ctx(phase: str = "split", branch: str = "main", seq: int = 3) -> Context:
    return Context(workflow_id="wf", workflow="fanout", phase=phase, seq=seq, branch=branch,
                   attempt=1, worker_id="w", schema_version=1, workflow_def=fanout)


def test_fork_names_branches_by_fork_seq_and_records_the_plan() -> None:
    c = ctx()
    assert c.fork([{"a": 1}, {"a": 2}], merge="combine") == ["f3.b0", "f3.b1"]
    assert c.fork_plan is not None
    assert (c.fork_plan.first_phase, c.fork_plan.merge_phase, c.fork_plan.after_merge) == (
        "work", "combine", "publish")
    assert c.fork_plan.branches == (("f3.b0", '{"a":1}'), ("f3.b1", '{"a":2}'))
    with pytest.raises(RuntimeError, match="already called"):
        c.fork([{}], merge="combine")


def test_dict_inputs_name_branches_and_win_tier_resolves_labels() -> None:
    plan = plan_fork(speculate, "plan", 0, "main", {"fast": 1, "slow": 2}, "pick", "race",
                     "good")
    assert plan.names == ["f0.fast", "f0.slow"] and plan.win_tier == 1


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"merge": "publish"}, "declare it with"),
    ({"merge": "nope"}, "no such phase"),
    ({"merge": "combine", "mode": "any"}, "mode must be"),
    ({"merge": "combine", "win_tier": "good"}, "only applies to mode='race'"),
    ({"merge": "combine", "inputs": []}, "1..64 inputs"),
    ({"merge": "combine", "inputs": {"x" * 30: 1}}, "1-26 chars"),
    ({"merge": "combine", "inputs": [object()]}, "not JSON"),
])
def test_bad_forks_fail_the_phase_at_once(kwargs: dict[str, Any], error: str) -> None:
    inputs = kwargs.pop("inputs", [{}])
    with pytest.raises(ForkError, match=error):
        ctx().fork(inputs, **kwargs)


@pytest.mark.parametrize(("deadline_s", "mode", "error"), [
    (5, "all", "only applies to mode='race'"),
    (0, "race", "must be seconds in"),
    (-1, "race", "must be seconds in"),
    (float("nan"), "race", "must be seconds in"),
    (True, "race", "must be seconds in"),
    ("5", "race", "must be seconds in"),
    (400 * 86400, "race", "must be seconds in"),
])
def test_bad_race_deadlines_fail_the_phase_at_once(deadline_s: Any, mode: str,
                                                   error: str) -> None:
    with pytest.raises(ForkError, match=error):
        plan_fork(speculate, "plan", 0, "main", [{}], "pick", mode, None,
                  deadline_s=deadline_s)


def test_a_race_deadline_is_planned_in_seconds() -> None:
    c = ctx()
    c.fork([{}], merge="combine", mode="race", deadline_s=3)
    assert c.fork_plan is not None and c.fork_plan.deadline_s == 3.0
    assert plan_fork(speculate, "plan", 0, "main", [{}], "pick", "race", None).deadline_s \
        is None


def test_merge_must_leave_room_for_branch_phases() -> None:
    with pytest.raises(ForkError, match="at least two phases"):
        ctx(phase="refine").fork([{}], merge="combine")


def nested_ctx(branch: str = "f0.b1", phase: str = "l1", depth: int = 1) -> Context:
    return Context(workflow_id="wf", workflow="tree", phase=phase, seq=1, branch=branch,
                   attempt=1, worker_id="w", schema_version=1, workflow_def=tree_wf,
                   fork_scope=ForkScope("join1", depth))


def test_a_branch_forks_children_named_after_it_one_level_deeper() -> None:
    c = nested_ctx()
    assert c.fork([{}, {}], merge="join2", require="all", max_retries=1) == [
        "f0.b1.f1.b0", "f0.b1.f1.b1"]
    plan = c.fork_plan
    assert plan is not None
    assert (plan.parent, plan.depth, plan.require_all, plan.max_retries, plan.first_phase) == (
        "f0.b1", 2, True, 1, "l2")


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"merge": "join1"}, "must merge before its branch's own merge phase 'join1'"),
    ({"merge": "done"}, "declare it with"),
    ({"merge": "join2", "require": "most"}, "require must be None or 'all'"),
    ({"merge": "join2", "max_retries": -1}, "max_retries must be an int >= 0"),
    ({"merge": "join2", "inputs": {"k" * 20: 1}}, "starts with its parent's"),
])
def test_bad_nested_forks_fail_the_phase_at_once(kwargs: dict[str, Any], error: str) -> None:
    inputs = kwargs.pop("inputs", [{}])
    with pytest.raises(ForkError, match=error):
        nested_ctx().fork(inputs, **kwargs)


def test_a_fork_in_a_branch_needs_the_worker_built_context() -> None:
    with pytest.raises(ForkError, match="needs the Context a worker builds"):
        ctx(branch="f0.b1").fork([{}], merge="combine")


def merged(*results: BranchResult, left: int = 2) -> MergedBranches:
    return MergedBranches(list(results), parent="main", fork_seq=0, retries_left=left,
                          first_phase="work")


def test_review_plans_retries_with_new_or_same_input_and_discards() -> None:
    c = ctx(phase="combine")
    c.merged = merged(BranchResult("f0.b0", {"v": 1}, 2), BranchResult("f0.b1", {"v": 2}, 2),
                      BranchResult("f0.b2", None, None, status="failed",
                                   error="TimeoutError (message withheld: 3 chars)"))
    assert c.merged[2].error_type == "TimeoutError" and not c.merged[2].ok
    c.review_branches({"f0.b0": "accept", "f0.b1": Retry(input={"v": 9}), "f0.b2": "retry"})
    plan = c.review_plan
    assert plan is not None and c.branching is plan
    assert plan.retries == (("f0.b1", '{"v":9}'), ("f0.b2", None))
    assert (plan.discards, plan.first_phase, plan.parent) == ((), "work", "main")
    with pytest.raises(RuntimeError, match="already called"):
        c.review_branches({})


@pytest.mark.parametrize(("decisions", "error"), [
    ({"f9.b0": "accept"}, "is not a branch of this merge"),
    ({"f0.b0": "maybe"}, "must be one of"),
    ({"f0.b0": Retry(input=object())}, "is not JSON"),
    ({"f0.b0": "retry", "f0.b1": "retry", "f0.b2": "retry"}, "budget has 2 left"),
])
def test_bad_reviews_fail_the_merge_phase_at_once(decisions: dict[str, Any],
                                                   error: str) -> None:
    c = ctx(phase="combine")
    c.merged = merged(*(BranchResult(f"f0.b{i}", {}, 2) for i in range(3)))
    with pytest.raises(ForkError, match=error):
        c.review_branches(decisions)


def test_review_needs_branches_to_review() -> None:
    with pytest.raises(ForkError, match=r"ctx\.merged is empty here"):
        ctx(phase="combine").review_branches({})


def test_tree_draws_nested_forks_under_their_parent_branch() -> None:
    run = {"workflow_id": "wf", "workflow": "tree", "status": "running"}
    checkpoints = [{"seq": 0, "branch": "main", "phase": "root", "kind": "phase"}]
    top = {"parent_branch": "main", "fork_seq": 0, "merge_seq": 1, "mode": "all",
           "merge_phase": "join1", "status": "open", "resolution": None, "winner": None,
           "branch_count": 1, "pending": 1, "retries": 0,
           "branches": [{"branch": "f0.b0", "status": "running", "retries": 0,
                         "steps": [{"seq": 1, "phase": "l1", "kind": "phase"}]}]}
    inner = {**top, "parent_branch": "f0.b0", "fork_seq": 1, "merge_seq": 2,
             "merge_phase": "join2", "status": "merged", "resolution": "fan_in",
             "branches": [{"branch": "f0.b0.f1.b0", "status": "failed", "retries": 1,
                           "steps": []}]}
    assert tree(run, checkpoints, [top, inner]).splitlines() == [
        "wf  tree  running",
        "├── * 0 root  fork all -> join1: open (0/1 done)",
        "│   └── f0.b0  running    1 l1",
        "│       └── fork@1 all -> join2: fan_in (1/1 done)",
        "│           └── f0.b0.f1.b0  failed     -  r1",
        "└── o 1 join1  waiting: 0/1 done",
    ]


def test_tree_draws_an_open_fork_and_a_race() -> None:
    run = {"workflow_id": "wf", "workflow": "speculate", "status": "running"}
    checkpoints = [{"seq": 0, "branch": "main", "phase": "plan", "kind": "phase"}]
    fork = {"fork_seq": 0, "mode": "race", "merge_phase": "pick", "status": "open",
            "resolution": None, "winner": None, "branch_count": 2, "pending": 2,
            "branches": [
                {"branch": "f0.s0", "status": "running",
                 "steps": [{"seq": 1, "phase": "attempt", "kind": "phase"}]},
                {"branch": "f0.s1", "status": "running", "steps": []}]}
    assert tree(run, checkpoints, [fork]).splitlines() == [
        "wf  speculate  running",
        "├── * 0 plan  fork race -> pick: open (0/2 done)",
        "│   ├── f0.s0  running    1 attempt",
        "│   └── f0.s1  running    -",
        "└── o 1 pick  waiting: 0/2 done",
    ]
    won = {**fork, "status": "merged", "resolution": "race", "winner": "f0.s1",
           "branches": [{**fork["branches"][0], "status": "discarded"},
                        {**fork["branches"][1], "status": "merged"}]}
    done = [*checkpoints, {"seq": 1, "branch": "main", "phase": "pick", "kind": "phase"}]
    assert tree(run, done, [won]).splitlines()[-1] == "└── * 1 pick  <- race won by f0.s1"
    assert "\x1b[" not in tree(run, done, [won])  # plain: no escape codes
    assert "\x1b[1mwf" in tree(run, done, [won], color=True)
