"""The benchmark workloads: no-op N-phase workflows, and a slow one for failover.

A no-op phase returns the state it was given, so what is measured is phasegate's own cost
per transition (parse, check, checkpoint, successor, settle) around one Postgres commit.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from phasegate import Context, Workflow

# The state every transition writes: ~1 KB of JSON, the same bytes the floor upserts.
PAYLOAD: dict[str, Any] = {"doc": "x" * 960, "n": 0}
FAILOVER_PHASE_S = 4.0

_on_last: dict[str, Callable[[], None]] = {}


def noop_workflow(phases: int) -> Workflow:
    """``bench-noop-N``: N phases that return their state unchanged."""
    workflow = Workflow(f"bench-noop-{phases}")
    name = workflow.name

    async def noop(ctx: Context, state: Any) -> Any:
        return state

    async def last(ctx: Context, state: Any) -> Any:
        hook = _on_last.get(name)
        if hook is not None:
            hook()
        return state

    for index in range(phases):
        workflow.phase(f"p{index}")(last if index == phases - 1 else noop)
    return workflow


def on_last_phase(workflow: Workflow, hook: Callable[[], None]) -> None:
    """Call ``hook`` whenever a run of ``workflow`` reaches its last phase (in-process only)."""
    _on_last[workflow.name] = hook


# For the worker processes (cold start, idle RSS): a short no-op workflow.
NOOP_3 = noop_workflow(3)

# Failover: a phase that records who runs it, then works for FAILOVER_PHASE_S.
failover = Workflow("bench-failover")


async def record_invocation(workflow_id: str, seq: int, worker: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(os.environ["PHASEGATE_DATABASE_URL"])
    try:
        await connection.execute(
            "INSERT INTO bench_invocations (workflow_id, seq, worker, pid) VALUES ($1,$2,$3,$4)",
            workflow_id, seq, worker, os.getpid())
    finally:
        await connection.close()


@failover.phase("slow")
async def slow(ctx: Context, state: Any) -> Any:
    await record_invocation(ctx.workflow_id, ctx.seq, ctx.worker_id)
    await asyncio.sleep(FAILOVER_PHASE_S)
    return state


@failover.phase("done")
async def done(ctx: Context, state: Any) -> Any:
    return state
