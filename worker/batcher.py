"""Coalesce many single SQS requests into batch calls without adding latency.

Callers ``await batcher.submit(item)``. One supervised task drains whatever has queued up
while the previous call was in flight, so a quiet worker sends batches of one immediately and
a busy one sends batches of ten. Up to ``max_concurrent`` calls overlap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from worker.limits import SQS_MAX_BATCH_ENTRIES

T = TypeVar("T")


class MicroBatcher(Generic[T]):
    def __init__(self, flush: Callable[[Sequence[T]], Awaitable[None]], *,
                 max_size: int = SQS_MAX_BATCH_ENTRIES, max_concurrent: int = 4) -> None:
        self._flush = flush
        self._max_size = max_size
        self._pending: asyncio.Queue[tuple[T, asyncio.Future[None]]] = asyncio.Queue()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._calls: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> None:
        """Queue ``item`` and wait until the batch holding it was sent (or raise its error)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.put_nowait((item, future))
        await future

    async def run(self) -> None:
        """The side task: runs until cancelled; in-flight calls finish first."""
        try:
            while True:
                first = await self._pending.get()
                await self._slots.acquire()
                batch = [first]
                while len(batch) < self._max_size and not self._pending.empty():
                    batch.append(self._pending.get_nowait())
                task = asyncio.create_task(self._call(batch))
                self._calls.add(task)
                task.add_done_callback(self._calls.discard)
        finally:
            if self._calls:
                await asyncio.gather(*self._calls, return_exceptions=True)

    async def _call(self, batch: list[tuple[T, asyncio.Future[None]]]) -> None:
        try:
            await self._flush([item for item, _ in batch])
        except Exception as exc:  # every waiter gets the error; the batcher itself lives on
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            for _, future in batch:
                if not future.done():
                    future.set_result(None)
        finally:
            self._slots.release()
