"""The heartbeat's warning names leases actually lost, not handles settled under the call."""

from __future__ import annotations

from structlog.testing import capture_logs

from phasegate.queue import Outgoing
from phasegate.settings import load_settings
from phasegate.worker.fake_queue import InMemoryFifoQueue
from phasegate.worker.runtime import Worker
from phasegate.workflow import Registry


async def _worker_holding_two() -> tuple[Worker, InMemoryFifoQueue, list[str]]:
    queue = InMemoryFifoQueue()
    await queue.send([Outgoing("a", "A", "d1"), Outgoing("b", "B", "d2")])
    received = await queue.receive(10, 0, 30)
    worker = Worker(settings=load_settings(), registry=Registry(), queue=queue)
    for message in received:
        worker._held[message.receipt_handle] = message
    return worker, queue, [m.receipt_handle for m in received]


async def test_a_handle_settled_while_the_heartbeat_ran_is_not_a_lost_lease() -> None:
    worker, queue, (settled, _) = await _worker_holding_two()
    await queue.delete([settled])  # the settle's delete won the race ...
    original = queue.change_visibility

    async def settle_during_call(entries: list[tuple[str, int]]) -> None:
        worker._held.pop(settled)  # ... and the handle left the held set before the answer
        await original(entries)

    queue.change_visibility = settle_during_call  # type: ignore[method-assign]
    with capture_logs() as logs:
        await worker._beat()
    assert [e for e in logs if e["event"] == "heartbeat_partial"] == []


async def test_a_held_message_whose_lease_failed_is_reported() -> None:
    worker, queue, (lost, _) = await _worker_holding_two()
    await queue.delete([lost])  # gone from the queue, still held by this worker: a lost lease
    with capture_logs() as logs:
        await worker._beat()
    assert [e["failed"] for e in logs if e["event"] == "heartbeat_partial"] == [1]
