"""Step 5, emit: the committed successor goes out (``PhaseTransition`` uses one ``Emitter``).

An outbox row is sent and then marked sent; a leased send (worker/continuation.py) has no row
to mark. Concurrent sends share one SendMessageBatch (the runtime's send batcher). A send that
fails is logged and counted, never raised: what was committed is the relay's to send.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from phasegate import concurrency, metrics, tracing
from phasegate.batcher import MicroBatcher
from phasegate.envelope import Envelope
from phasegate.faults import Faults
from phasegate.queue import Outgoing, Queue
from phasegate.store import Lease, OutboxRow, Store

log = structlog.get_logger("phasegate.transition")


class Emitter:
    def __init__(self, *, store: Store, queue: Queue, faults: Faults, sent_lease: Lease,
                 mark_sent: MicroBatcher[int] | None = None,
                 sender: MicroBatcher[Outgoing] | None = None) -> None:
        self.store = store
        self.queue = queue
        self.faults = faults
        self.sent_lease = sent_lease
        self._mark_sent = mark_sent
        self._sender = sender

    async def successor(self, row: OutboxRow, committed: float,
                        issued: asyncio.Future[None] | None = None) -> bool:
        """A commit's outbox row, right after the commit."""
        sent = await self.emit(row, committed, issued)
        self.faults.hit("after_send")
        return sent

    async def leased(self, successor: Envelope, body: str, committed: float,
                     issued: asyncio.Future[None]) -> bool:
        """A leased send's message. Should the send fail, the message becomes an outbox row at
        once, for the relay to send within ``PHASEGATE_RELAY_AFTER_S``; should that fail too,
        the relay writes it when the lease runs out."""
        if await self._send(Outgoing(body, successor.group_id, successor.dedup_id), issued):
            metrics.OUTBOX_SEND_LAG.observe(time.monotonic() - committed)
            self.faults.hit("after_send")
            return True
        try:
            await self.store.end_chain(successor, body, holder=self.sent_lease.holder)
        except Exception as exc:
            log.warning("leased_send_left_to_lease", error=type(exc).__name__)
        return False

    async def emit(self, row: OutboxRow, committed: float | None = None,
                   issued: asyncio.Future[None] | None = None) -> bool:
        """Send an outbox row and mark it sent. On failure the relay sends it later.

        Marking sent does not hold up the delete of the received message: it is posted to a
        batcher (a row left unmarked is only sent again by the relay, and SQS drops it by its
        deduplication id)."""
        if not await self._send(Outgoing(row.body, row.group_id, row.dedup_id), issued):
            return False
        if committed is not None:
            metrics.OUTBOX_SEND_LAG.observe(time.monotonic() - committed)
        if self._mark_sent is not None:
            self._mark_sent.post(row.outbox_id)
        else:
            await self.store.mark_sent([row.outbox_id])
        return True

    async def admitted(self, workflow_id: str) -> None:
        """Send the start messages of the runs this run's end admitted (concurrency.py)."""
        rows = await concurrency.admitted_by(self.store, workflow_id)
        await asyncio.gather(*(self.emit(row) for row in rows))

    async def _send(self, message: Outgoing, issued: asyncio.Future[None] | None) -> bool:
        """One message through the send batcher; False (logged, counted) when it failed.
        ``issued`` is set once the request is under way, or whatever became of it."""
        try:
            with tracing.send_span("queue"):
                if self._sender is not None:
                    await self._sender.submit(message, issued)
                else:
                    _set(issued)
                    await self.queue.send([message])
        except Exception as exc:
            metrics.SQS_ERRORS.labels("send").inc()
            log.warning("emit_failed_relay_will_send", error=type(exc).__name__)
            return False
        finally:
            _set(issued)  # whatever became of the send, whoever waits for it goes on
        return True


def _set(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
