"""Workflows that fork, for the branch tests (in-process and in worker subprocesses:
``PHASEGATE_WORKFLOW_MODULES=tests.workflows_branches``).

Every phase records its invocation (``test_invocations``, note = the branch), so tests count
how often a phase really ran, across processes and kills.
"""

from __future__ import annotations

from typing import Any

from phasegate import Context, Workflow
from tests.workflows import branch_gate, record, wait_gate

# -- fan-out / fan-in: split -> (work -> refine) x N -> combine -> publish -------------------

fanout = Workflow("fanout", schema_version=1)


@fanout.phase("split")
async def split(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    inputs = [{"i": i, "gate": state.get("gate"), "gated": state.get("gated", [])}
              for i in range(state["n"])]
    ctx.fork(inputs, merge="combine", mode=state.get("mode", "all"))
    return {**state, "split": True}


@fanout.phase("work")
async def work(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "worked": state["i"] + 1}


@fanout.phase("refine")
async def refine(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    if state["i"] in state["gated"]:
        await wait_gate(branch_gate(state["gate"], state["i"]))
    return {**state, "refined": state["worked"] * 10}


@fanout.merge("combine")
async def combine(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {"split": state["split"], "branches": [r.branch for r in ctx.merged],
            "values": [r.state["refined"] for r in ctx.merged],
            "total": sum(r.state["refined"] for r in ctx.merged)}


@fanout.phase("publish")
async def publish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "published": True}


# -- speculation: the first branch to finish, or to reach the "good" tier, wins --------------


def _good(state: Any) -> bool:
    return isinstance(state, dict) and bool(state.get("good"))


speculate = Workflow("speculate", schema_version=1, tiers=[("good", _good)])


@speculate.phase("plan")
async def plan(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    ctx.fork({f"s{i}": {"i": i, **state} for i in range(state["n"])}, merge="pick",
             mode="race", win_tier=state.get("win_tier"))
    return {"planned": True}


@speculate.phase("attempt")
async def attempt(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    if state["i"] != state["fast"]:
        await wait_gate(branch_gate(state["gate"], state["i"]))
    return {**state, "good": state["i"] in state.get("good_at_attempt", [])}


@speculate.phase("polish")
async def polish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "polished": True}


@speculate.merge("pick")
async def pick(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx, ctx.branch)
    return {**state, "winners": [r.branch for r in ctx.merged],
            "winner_state": [r.state for r in ctx.merged]}


# -- two branches, each one phase: for the concurrent "last commit" test ---------------------

pair = Workflow("pair", schema_version=1)


@pair.phase("fork")
async def pair_fork(ctx: Context, state: Any) -> Any:
    ctx.fork([{"i": 0}, {"i": 1}], merge="join")
    return state


@pair.phase("leg")
async def pair_leg(ctx: Context, state: Any) -> Any:
    return state


@pair.merge("join")
async def pair_join(ctx: Context, state: Any) -> Any:
    return [r.state for r in ctx.merged]
