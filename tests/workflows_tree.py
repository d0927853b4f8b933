"""Workflows for nested, failure-tolerant and reviewed branches (in-process and in worker
subprocesses: ``PHASEGATE_WORKFLOW_MODULES=tests.workflows_tree``).

Every phase records its invocation (``test_invocations``, note = the branch).
"""

from __future__ import annotations

from typing import Any

from phasegate import Context, NonRetryableError, Retry, Workflow
from tests.workflows import branch_gate, record, wait_gate

# -- a 3-level fork tree: root -> l1 -> l2 -> leaf -> join3 -> join2 -> join1 -> done --------
# root forks on main (merge join1); each level-1 branch forks again in l1 (merge join2); each
# level-2 branch in l2 (merge join3); level-3 branches run `leaf` only.

tree = Workflow("tree", schema_version=1)


def _children(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**state, "path": [*state["path"], i]} for i in range(state["n"])]


@tree.phase("root")
async def root(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    ctx.fork(_children({**state, "path": []}), merge="join1", require=state.get("require"))
    return state


@tree.phase("l1")
async def l1(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    ctx.fork(_children(state), merge="join2", require=state.get("require"))
    return state


@tree.phase("l2")
async def l2(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    ctx.fork(_children(state), merge="join3", require=state.get("require"))
    return state


def leaf_value(path: list[int]) -> int:
    return 100 * path[0] + 10 * path[1] + path[2] + 1


@tree.phase("leaf")
async def leaf(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {"path": state["path"], "value": leaf_value(state["path"]), "leaves": 1,
            "failed": []}


async def _join(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    done = [r for r in ctx.merged if r.ok]
    return {**state, "value": sum(r.state["value"] for r in done),
            "leaves": sum(r.state["leaves"] for r in done),
            "failed": [f for r in done for f in r.state["failed"]]
            + [f"{r.branch}:{r.error_type}" for r in ctx.merged if not r.ok]}


tree.merge("join3")(_join)
tree.merge("join2")(_join)
tree.merge("join1")(_join)


@tree.phase("done")
async def done(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "done": True}


# -- races and fan-ins with failing branches -------------------------------------------------

flaky = Workflow("flaky", schema_version=1)


@flaky.phase("plan")
async def plan(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    ctx.fork([{**state, "i": i} for i in range(state["n"])], merge="pick",
             mode=state.get("mode", "race"), require=state.get("require"))
    return {"planned": True}


@flaky.phase("attempt")
async def attempt(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    if state["i"] in state["fail"]:
        if state.get("fail_gate"):  # held until the test has seen the others finish
            await wait_gate(branch_gate(state["fail_gate"], state["i"]))
        raise NonRetryableError("this strategy cannot work")
    if state.get("gate"):  # held until the test has seen the others fail
        await wait_gate(branch_gate(state["gate"], state["i"]))
    return {"i": state["i"], "result": state["i"] * 7}


@flaky.merge("pick")
async def pick(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "won": [r.branch for r in ctx.merged if r.ok],
            "results": [r.state["result"] for r in ctx.merged if r.ok],
            "failed": {r.branch: r.error_type for r in ctx.merged if not r.ok}}


# -- supervisor review: the merge rejects f0.b1 twice (new input, then the same), then accepts;
# f0.b2 is discarded in the last round ----------------------------------------------------

review = Workflow("review", schema_version=1)


@review.phase("ask")
async def ask(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    ctx.fork([{"x": 1}, {"x": 2}, {"x": 3}], merge="judge",
             max_retries=state.get("budget", 3))
    return {"rounds": 0}


@review.phase("draft")
async def draft(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {"x": state["x"], "score": state["x"] * 10}


@review.merge("judge")
async def judge(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    rounds = state["rounds"]
    by = {r.branch: r for r in ctx.merged}
    if rounds == 0:
        ctx.review_branches({"f0.b1": Retry(input={"x": by["f0.b1"].state["x"] + 2})})
        return {**state, "rounds": 1}
    if rounds == 1:
        ctx.review_branches({"f0.b1": "retry", "f0.b0": "accept"})
        return {**state, "rounds": 2}
    ctx.review_branches({"f0.b2": "discard"})
    return {**state, "rounds": rounds + 1,
            "scores": {r.branch: r.state["score"] for r in ctx.merged
                       if r.branch != "f0.b2"},
            "inputs": {r.branch: r.input for r in ctx.merged},
            "retries": {r.branch: r.retries for r in ctx.merged}}


@review.phase("finish")
async def finish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "finished": True}


# -- two levels, two legs: for the held-lock nested fan-in test -----------------------------

nest = Workflow("nest", schema_version=1)


@nest.phase("outer")
async def nest_outer(ctx: Context, state: Any) -> Any:
    ctx.fork([{"o": 0}], merge="join_outer")
    return state


@nest.phase("inner")
async def nest_inner(ctx: Context, state: Any) -> Any:
    ctx.fork([{"i": 0}, {"i": 1}], merge="join_inner")
    return state


@nest.phase("leg")
async def nest_leg(ctx: Context, state: Any) -> Any:
    return state


@nest.merge("join_inner")
async def nest_join_inner(ctx: Context, state: Any) -> Any:
    return [r.state for r in ctx.merged]


@nest.merge("join_outer")
async def nest_join_outer(ctx: Context, state: Any) -> Any:
    return [r.state for r in ctx.merged]


# -- a review inside a branch: the nested merge retries one child once -----------------------

inner_review = Workflow("inner-review", schema_version=1)


@inner_review.phase("top")
async def ir_top(ctx: Context, state: Any) -> Any:
    ctx.fork({"a": {}}, merge="close")
    return {}


@inner_review.phase("spread")
async def ir_spread(ctx: Context, state: Any) -> Any:
    ctx.fork([{"x": 1}, {"x": 2}], merge="judge_inner")
    return {"round": 0}


@inner_review.phase("try")
async def ir_try(ctx: Context, state: Any) -> Any:
    await record(ctx, ctx.branch)
    return {"x": state["x"]}


@inner_review.merge("judge_inner")
async def ir_judge(ctx: Context, state: Any) -> Any:
    await record(ctx, ctx.branch)
    if state["round"] == 0:
        ctx.review_branches({ctx.merged[1].branch: Retry(input={"x": 5}),
                             ctx.merged[0].branch: "discard"})
        return {"round": 1}
    return {"round": 2, "xs": [r.state["x"] for r in ctx.merged]}


@inner_review.merge("close")
async def ir_close(ctx: Context, state: Any) -> Any:
    return {"inner": ctx.merged[0].state}
