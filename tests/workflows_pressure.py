"""Workflows that put real memory pressure on the worker running them
(``PHASEGATE_WORKFLOW_MODULES=tests.workflows_pressure``); used by the watchdog tests and
``bench/watchdog_leadtime.py``.

``pressure.scan`` reads a large file again and again after evicting it from the page cache
(``posix_fadvise(DONTNEED)``), publishing how far it got with ``ctx.progress`` after every
chunk; inside a small memory cgroup that is reclaim pressure PSI sees. It keeps reading until
a gate file exists, then returns. A restarted phase continues from ``ctx.resumed_progress``.

``spike.grow`` allocates ``spike_mb`` MiB of heap as fast as it can: in a cgroup with a
smaller limit, an OOM kill with no PSI warning at all.

``leak.grow`` (bench) reads like ``scan`` while the heap grows by ``leak_mb_per_s`` until the
kernel kills the worker, the case the watchdog exists for.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, BinaryIO

from phasegate import Context, Workflow
from tests.workflows import record, wait_gate

CHUNK = 1 << 20


def _evict(fd: int) -> None:
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _open(path: str) -> BinaryIO:
    # Blocking reads on purpose: the page-cache churn IS the workload.
    return open(path, "rb", buffering=0)


def _gate_open(gate: str) -> bool:
    return os.path.exists(gate)


async def _read_until_gate(ctx: Context, path: str, gate: str, chunks: int,
                           leak_mb_per_s: float = 0.0) -> int:
    heap: list[bytes] = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    with _open(path) as f:
        while not _gate_open(gate):
            _evict(f.fileno())
            f.seek(0)
            while f.read(CHUNK):
                chunks += 1
                ctx.progress({"chunks": chunks})
                if leak_mb_per_s:
                    want = int((loop.time() - started) * leak_mb_per_s)
                    while len(heap) < want:
                        heap.append(b"\x01" * CHUNK)  # touched pages, not a lazy mapping
                await asyncio.sleep(0)  # a real phase awaits I/O; the flush runs in between
                if chunks % 64 == 0 and _gate_open(gate):
                    break
    return chunks


pressure = Workflow("pressure", schema_version=1)


@pressure.phase("scan")
async def scan(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    start = int((ctx.resumed_progress or {}).get("chunks", 0))
    await record(ctx, f"start:{start}")
    chunks = await _read_until_gate(ctx, state["file"], state["gate"], start)
    return {**state, "chunks": chunks, "resumed_from": start}


@pressure.phase("done")
async def scan_done(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return state


spike = Workflow("spike", schema_version=1)


@spike.phase("prepare")
async def prepare(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return {**state, "prepared": [f"item-{i}" for i in range(state.get("items", 100))]}


@spike.phase("grow")
async def grow(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    heap = [b"\x01" * (16 * CHUNK) for _ in range(state["spike_mb"] // 16)]
    total = sum(len(block) for block in heap)
    del heap
    return {**state, "spiked_bytes": total}


@spike.phase("finish")
async def finish(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    await record(ctx)
    return {**state, "finished": True}


leak = Workflow("leak", schema_version=1)


@leak.phase("grow")
async def leak_grow(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    start = int((ctx.resumed_progress or {}).get("chunks", 0))
    await record(ctx, f"start:{start}")
    chunks = await _read_until_gate(ctx, state["file"], state["gate"], start,
                                    leak_mb_per_s=state.get("leak_mb_per_s", 0.0))
    return {**state, "chunks": chunks, "resumed_from": start}


@leak.phase("done")
async def leak_done(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return state


progressive = Workflow("progressive", schema_version=1)


@progressive.phase("work")
async def work(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    """Publishes progress, then waits at a gate (in-process flush tests)."""
    await record(ctx)
    for step in range(1, 4):
        ctx.progress({"step": step})
    await wait_gate(state["gate"])
    return {**state, "resumed": ctx.resumed_progress}


@progressive.phase("end")
async def work_end(ctx: Context, state: dict[str, Any]) -> dict[str, Any]:
    return state
