"""The worker's side tasks (heartbeat, batchers, deletion cost, emergency flush, presence):
started together, watched while the receive loop runs, stopped together.

Supervised, never fire-and-forget: if one dies, the worker stops receiving, drains, and
raises naming the task, so the pod restarts loudly instead of running without a heartbeat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import suppress
from typing import Any

import structlog

log = structlog.get_logger("phasegate.worker")


class SideTasks:
    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def start(self, name: str, work: Coroutine[Any, Any, Any]) -> None:
        self.tasks.add(asyncio.create_task(work, name=name))

    async def supervise(self, main: Awaitable[None], *, stop: Callable[[], None],
                        drain: Callable[[], Awaitable[None]]) -> None:
        """Run ``main`` (the receive loop) while watching the side tasks; a dead side task
        stops all: ``stop``, cancel ``main``, ``drain``, then raise."""
        main_task = asyncio.ensure_future(main)
        done, _ = await asyncio.wait({main_task, *self.tasks},
                                     return_when=asyncio.FIRST_COMPLETED)
        if main_task in done:
            main_task.result()
            return
        failed = next(iter(done))
        stop()
        main_task.cancel()
        with suppress(asyncio.CancelledError):
            await main_task
        error = failed.exception() if not failed.cancelled() else None
        log.error("side_task_died", task=failed.get_name(), error=repr(error))
        await drain()
        raise RuntimeError(f"side task {failed.get_name()} stopped: {error!r}")

    async def stop(self, flush_s: float) -> None:
        """Cancel every side task. The batchers flush what is queued on their way out
        (mark-sent, successor sends); bounded by ``flush_s``, because what they drop is the
        relay's anyway."""
        for task in self.tasks:
            task.cancel()
        _, unflushed = await asyncio.wait(self.tasks, timeout=flush_s)
        for task in unflushed:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
