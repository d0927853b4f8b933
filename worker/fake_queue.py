"""An in-memory SQS FIFO queue for unit tests and benchmarks (not for guarantees: those are
proven against a real SQS server over HTTP).

It honours what the engine relies on: per-group ordering and hold-back (no message of a group
is handed out while an earlier one of that group is in flight), deduplication by id within a
window, visibility timeouts and their extension, receive counts, and approximate depth.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

from phasegate.limits import SQS_DEDUP_WINDOW_SECONDS, SQS_MAX_RECEIVE_BATCH
from phasegate.queue import Outgoing, QueueDepth, QueueError, Received


@dataclass
class _Message:
    message_id: str
    body: str
    group_id: str
    receive_count: int = 0
    visible_at: float = 0.0
    receipt: str | None = None


@dataclass
class InMemoryFifoQueue:
    clock: Callable[[], float] = time.monotonic
    dedup_window_s: float = SQS_DEDUP_WINDOW_SECONDS
    calls: int = 0
    _messages: list[_Message] = field(default_factory=list)
    _dedup: dict[str, float] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _arrived: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._arrived is None:
            self._arrived = asyncio.Event()
        return self._arrived

    async def send(self, messages: Sequence[Outgoing]) -> None:
        self.calls += 1
        now = self.clock()
        for message in messages:
            seen = self._dedup.get(message.dedup_id)
            if seen is not None and now - seen < self.dedup_window_s:
                continue
            self._dedup[message.dedup_id] = now
            self._messages.append(_Message(f"m-{next(self._ids)}", message.body,
                                           message.group_id))
        self._event().set()

    def _take(self, max_messages: int, visibility_timeout_s: int) -> list[Received]:
        now = self.clock()
        busy = {m.group_id for m in self._messages if m.visible_at > now}
        taken: list[Received] = []
        for message in self._messages:
            if len(taken) >= max_messages:
                break
            if message.group_id in busy or message.visible_at > now:
                busy.add(message.group_id)  # order within a group: stop at its first message
                continue
            message.receive_count += 1
            message.visible_at = now + visibility_timeout_s
            message.receipt = f"{message.message_id}:{message.receive_count}"
            taken.append(Received(message.message_id, message.receipt, message.body,
                                  message.group_id, message.receive_count))
            busy.add(message.group_id)
        return taken

    async def receive(self, max_messages: int, wait_time_s: int,
                      visibility_timeout_s: int) -> list[Received]:
        assert 1 <= max_messages <= SQS_MAX_RECEIVE_BATCH
        self.calls += 1
        deadline = self.clock() + wait_time_s
        while True:
            taken = self._take(max_messages, visibility_timeout_s)
            remaining = deadline - self.clock()
            if taken or remaining <= 0:
                return taken
            event = self._event()
            event.clear()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that lands
            # as the event fires, and the caller's stop would then wait out the whole poll.
            with suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, 0.05)):
                    await event.wait()

    def _by_receipt(self, receipt: str) -> _Message | None:
        return next((m for m in self._messages if m.receipt == receipt), None)

    async def delete(self, receipt_handles: Sequence[str]) -> None:
        self.calls += 1
        gone = set(receipt_handles)
        self._messages = [m for m in self._messages if m.receipt not in gone]
        self._event().set()

    async def change_visibility(self, entries: Sequence[tuple[str, int]]) -> None:
        self.calls += 1
        failed: dict[str, str] = {}
        now = self.clock()
        for receipt, seconds in entries:
            message = self._by_receipt(receipt)
            if message is None:
                failed[receipt] = "ReceiptHandleIsInvalid"
                continue
            message.visible_at = now + seconds
        self._event().set()
        if failed:
            raise QueueError("ChangeMessageVisibilityBatch", failed)

    async def is_fifo(self) -> bool:
        return True

    async def fifo_attributes(self) -> dict[str, str]:
        return {"FifoQueue": "true", "DeduplicationScope": "messageGroup",
                "FifoThroughputLimit": "perMessageGroupId"}

    async def depth(self) -> QueueDepth:
        self.calls += 1
        now = self.clock()
        inflight = sum(1 for m in self._messages if m.visible_at > now)
        return QueueDepth(visible=len(self._messages) - inflight, inflight=inflight, delayed=0)
