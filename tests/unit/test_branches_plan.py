"""ctx.fork's checks and branch names, and the --tree drawing, without servers."""

from __future__ import annotations

from typing import Any

import pytest

from phasegate import Context
from phasegate.branches import ForkError, plan_fork
from phasegate.orchestrator.render_tree import tree
from tests.workflows_branches import fanout, speculate


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


def test_merge_must_leave_room_for_branch_phases_and_branches_do_not_fork() -> None:
    with pytest.raises(ForkError, match="at least two phases"):
        ctx(phase="refine").fork([{}], merge="combine")
    with pytest.raises(ForkError, match="do not fork again"):
        ctx(branch="f0.b1").fork([{}], merge="combine")


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
