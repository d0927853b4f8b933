"""Coalesce many single SQS requests into batch calls without adding latency.

Callers ``await batcher.submit(item)``, or ``batcher.post(item)`` when nothing waits on the
outcome. A submit with nothing queued or in flight is called at once from its own task. One
supervised task drains whatever has queued up while a call was in flight, so a quiet worker
sends batches of one immediately and a busy one sends batches of ten. Up to ``max_concurrent``
calls overlap; what is still queued when the task is cancelled is flushed before it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import structlog

from phasegate.limits import SQS_MAX_BATCH_ENTRIES

T = TypeVar("T")

log = structlog.get_logger("phasegate.batcher")

# Outbox rows marked sent by one UPDATE (the worker's and the API's batch of marks).
MARKS_PER_CALL = 500
# Marking outbox rows sent waits this long to gather a batch: one UPDATE for many messages
# even when a single workflow runs, off the sender's path (nothing waits on it). Far below
# the relay's age threshold (relay_after_s), so the relay never sends a row for this delay.
MARK_SENT_LINGER_S = 0.05


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
        self._direct = 0  # calls made from a submitting task (``_direct_call``)

    async def submit(self, item: T, issued: asyncio.Future[None] | None = None) -> None:
        """Queue ``item`` and wait until the batch holding it was sent (or raise its error).
        ``issued``: set when the call carrying ``item`` starts (its request under way)."""
        if not self._calls and not self._direct and not self._linger_s \
                and self._pending.empty() and not self._slots.locked():
            await self._direct_call(item, issued)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if issued is not None:
            self._issued[future] = issued
        self._pending.put_nowait((item, future))
        await future

    async def _direct_call(self, item: T, issued: asyncio.Future[None] | None) -> None:
        """Nothing queued or in flight: the call is made from the caller's task, with no
        queue hop, no call task and no future (a quiet worker's every call). Whatever is
        submitted meanwhile queues and goes in the next batch, as behind any call."""
        await self._slots.acquire()  # free (checked by the caller): returns at once
        self._direct += 1
        try:
            if issued is not None and not issued.done():
                issued.set_result(None)
            await self._flush([item])
        except asyncio.CancelledError:
            # The caller's cancel (a hard stop) cut the call short: it goes again from the
            # side task, as a queued item would have gone. Every call here can be repeated
            # (a delete, a visibility change, a send under its deduplication id).
            self._pending.put_nowait((item, None))
            raise
        finally:
            self._direct -= 1
            self._slots.release()

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
