"""The benchmark workloads: no-op N-phase workflows, and a slow one for failover.

A no-op phase returns the state it was given, so what is measured is phasegate's own cost
per transition (parse, check, checkpoint, successor, settle) around one Postgres commit.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from typing import Any

from phasegate import Context, Registry, Workflow
from phasegate.envelope import start_message
from phasegate.queue import Outgoing, Queue
from phasegate.settings import Settings
from phasegate.store import Store
from phasegate.worker.runtime import Worker

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


async def seed_runs(store: Store, queue: Queue, workflow: Workflow, groups: int,
                    prefix: str) -> None:
    """Start ``groups`` runs of ``workflow``: their rows, and their start messages queued."""
    for index in range(groups):
        workflow_id = f"{prefix}{index}-{uuid.uuid4().hex[:8]}"
        message = start_message(workflow_id, workflow.name, PAYLOAD)
        await store.start_run(workflow_id=workflow_id, workflow=workflow.name,
                              schema_version=workflow.schema_version, input=PAYLOAD,
                              first_phase=workflow.first_phase, message=message)
        await queue.send([Outgoing(message.to_json(), message.group_id, message.dedup_id)])


def stopping_worker(settings: Settings, workflow: Workflow, groups: int, *, queue: Queue,
                    dlq: Queue, store: Store) -> Worker:
    """An in-process worker that stops itself once ``groups`` runs have run their last phase
    (its drain lets the last commit finish)."""
    worker = Worker(settings=settings, registry=Registry([workflow]), queue=queue, dlq=dlq,
                    store=store)
    finished = 0

    def last_phase_ran() -> None:
        nonlocal finished
        finished += 1
        if finished >= groups:
            worker.stop()

    on_last_phase(workflow, last_phase_ran)
    return worker
