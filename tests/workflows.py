"""Workflows the tests run, in-process and in worker subprocesses
(``PHASEGATE_WORKFLOW_MODULES=tests.workflows``).

Phases record every invocation in ``test_invocations`` (a table only test databases have), so
tests can count how often a phase really ran, across processes and crashes.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from phasegate import Context, NonRetryableError, Workflow
from phasegate.db import connect

LEDGER_DSN: str | None = None


def ledger_dsn() -> str:
    return LEDGER_DSN or os.environ["PHASEGATE_DATABASE_URL"]


async def record(ctx: Context, note: str = "") -> None:
    connection = await connect(ledger_dsn())
    try:
        await connection.execute(
            "INSERT INTO test_invocations (workflow_id, seq, phase, attempt, worker_id, note) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            ctx.workflow_id, ctx.seq, ctx.phase, ctx.attempt, ctx.worker_id, note)
    finally:
        await connection.close()


def branch_gate(gate: str, i: int) -> str:
    """The gate branch ``i`` of a fork waits at, ``<gate>-<i>``: the branch workflows
    (tests/workflows_branch*.py, workflows_tree.py) wait there, the tests open it by name."""
    return f"{gate}-{i}"


async def wait_gate(name: str, timeout: float = 120) -> None:
    """Block the phase until a test opens the gate (a row in test_gates)."""
    connection = await connect(ledger_dsn())
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while not await connection.fetchval("SELECT 1 FROM test_gates WHERE name = $1", name):
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"gate {name} never opened")
            await asyncio.sleep(0.05)
    finally:
        await connection.close()


chain = Workflow("chain", schema_version=1)


@chain.phase("fetch")
async def fetch(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return {**state, "trail": [*state.get("trail", []), "fetch"], "n": state.get("n", 0) + 1}


@chain.phase("transform")
async def transform(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return {**state, "trail": [*state["trail"], "transform"], "n": state["n"] * 10}


@chain.phase("publish")
async def publish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return {**state, "trail": [*state["trail"], "publish"], "n": state["n"] + 1}


gated = Workflow("gated", schema_version=1)


@gated.phase("before")
async def before(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return state


@gated.phase("held")
async def held(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    await wait_gate(state["gate"])
    return {**state, "held_done": True}


@gated.phase("after")
async def after(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return {**state, "after_done": True}


slow = Workflow("slow", schema_version=1)


@slow.phase("long")
async def long(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    await asyncio.sleep(state["seconds"])  # the workload itself: a phase longer than a lease
    return state


@slow.phase("done")
async def slow_done(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return state


flaky = Workflow("flaky", schema_version=1)


@flaky.phase("try")
async def try_phase(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    if ctx.attempt <= state["fail_times"]:
        raise RuntimeError(f"transient failure on attempt {ctx.attempt}")
    return {**state, "succeeded_on": ctx.attempt}


@flaky.phase("end")
async def flaky_end(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return state


broken = Workflow("broken", schema_version=1)


@broken.phase("boom")
async def boom(ctx: Context, state: Any) -> Any:
    if isinstance(state, dict) and state.get("fatal"):
        raise NonRetryableError("this input can never work")
    if isinstance(state, dict) and state.get("bad_state"):
        return {"not_json": object()}
    raise RuntimeError("always fails")
