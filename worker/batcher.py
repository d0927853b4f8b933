"""Coalesce many single SQS requests into batch calls without adding latency.

Callers ``await batcher.submit(item)``, or ``batcher.post(item)`` when nothing waits on the
outcome. One supervised task drains whatever has queued up while the previous call was in
flight, so a quiet worker sends batches of one immediately and a busy one sends batches of
ten. Up to ``max_concurrent`` calls overlap; what is still queued when the task is cancelled
is flushed before it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import structlog

from phasegate.limits import SQS_MAX_BATCH_ENTRIES

T = TypeVar("T")

log = structlog.get_logger("phasegate.batcher")


class MicroBatcher(Generic[T]):
    def __init__(self, flush: Callable[[Sequence[T]], Awaitable[None]], *,
                 max_size: int = SQS_MAX_BATCH_ENTRIES, max_concurrent: int = 4,
                 linger_s: float = 0.0) -> None:
        self._flush = flush
        self._max_size = max_size
        # Wait this long after the first item before calling, to gather more. Only for work
        # nobody waits on (posted items): it trades their delay for fewer calls.
        self._linger_s = linger_s
        self._pending: asyncio.Queue[tuple[T, asyncio.Future[None] | None]] = asyncio.Queue()
        self._slots = asyncio.Semaphore(max_concurrent)
        self._calls: set[asyncio.Task[None]] = set()
        self._issued: dict[asyncio.Future[None], asyncio.Future[None]] = {}

    async def submit(self, item: T, issued: asyncio.Future[None] | None = None) -> None:
        """Queue ``item`` and wait until the batch holding it was sent (or raise its error).
        ``issued``: set when the call carrying ``item`` starts (its request under way)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if issued is not None:
            self._issued[future] = issued
        self._pending.put_nowait((item, future))
        await future

    def post(self, item: T) -> None:
        """Queue ``item`` without waiting for its batch. A failure is logged, not raised: only
        for work whose loss something else covers (the relay sends unmarked outbox rows)."""
        self._pending.put_nowait((item, None))

    async def run(self) -> None:
        """The side task: runs until cancelled; in-flight calls finish first, then whatever is
        still queued is flushed."""
        batch: list[tuple[T, asyncio.Future[None] | None]] = []
        try:
            while True:
                batch = [await self._pending.get()]
                if self._linger_s:
                    await asyncio.sleep(self._linger_s)
                await self._slots.acquire()
                while len(batch) < self._max_size and not self._pending.empty():
                    batch.append(self._pending.get_nowait())
                task = asyncio.create_task(self._call(batch))
                batch = []
                self._calls.add(task)
                task.add_done_callback(self._calls.discard)
        finally:
            if self._calls:
                await asyncio.gather(*self._calls, return_exceptions=True)
            while not self._pending.empty():
                batch.append(self._pending.get_nowait())
            for start in range(0, len(batch), self._max_size):
                await self._slots.acquire()  # free: every call above has finished
                await self._call(batch[start:start + self._max_size])

    async def _call(self, batch: list[tuple[T, asyncio.Future[None] | None]]) -> None:
        for _, future in batch:
            issued = self._issued.pop(future, None) if future is not None else None
            if issued is not None and not issued.done():
                issued.set_result(None)
        try:
            await self._flush([item for item, _ in batch])
        except Exception as exc:  # every waiter gets the error; the batcher itself lives on
            for _, future in batch:
                if future is not None and not future.done():
                    future.set_exception(exc)
            if any(future is None for _, future in batch):
                log.warning("batch_failed", error=f"{type(exc).__name__}: {exc}"[:200])
        else:
            for _, future in batch:
                if future is not None and not future.done():
                    future.set_result(None)
        finally:
            self._slots.release()
