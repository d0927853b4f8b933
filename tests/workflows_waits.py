"""Workflows with durable waits (timers, signals), in-process and in worker subprocesses
(``PHASEGATE_WORKFLOW_MODULES=tests.workflows_waits``). Phases record every invocation in
``test_invocations`` (tests/workflows.py)."""

from __future__ import annotations

from typing import Any

from phasegate import Context, Workflow
from tests.workflows import record

# Three phases with a timer before each of the last two: input {"wait_s": seconds}.
timed = Workflow("timed", schema_version=1)


@timed.phase("a")
async def timed_a(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    ctx.defer_next(state["wait_s"])
    return {**state, "trail": ["a"]}


@timed.phase("b")
async def timed_b(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    ctx.defer_next(state.get("second_wait_s", 0))
    return {**state, "trail": [*state["trail"], "b"]}


@timed.phase("c")
async def timed_c(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return {**state, "trail": [*state["trail"], "c"]}


# Waits for signal "approval" (input {"timeout_s": seconds}); "act" keeps what it got.
signalled = Workflow("signalled", schema_version=1)


@signalled.phase("ask")
async def ask(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    ctx.wait_for_signal("approval", timeout_s=state["timeout_s"])
    return state


@signalled.phase("act")
async def act(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return {**state, "signal": ctx.signal, "timed_out": ctx.signal is None}


# "ask" waits for signal "approval"; "act" and "after" each keep the signal they saw. The
# signal is delivered to act's seq only: "after" (run in the same worker's chain when local
# continuation is on) must see none, as it would through SQS.
signalled_then_after = Workflow("signalled_then_after", schema_version=1)


@signalled_then_after.phase("ask")
async def ask_then(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    ctx.wait_for_signal("approval", timeout_s=3600)
    return state


@signalled_then_after.phase("act")
async def act_then(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "act_signal": ctx.signal}


@signalled_then_after.phase("after")
async def after(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "after_signal": ctx.signal}
