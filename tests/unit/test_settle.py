"""The one place messages are settled: a successor's send and the received message's delete
go out together, and the message's slot is freed only when both are done."""

from __future__ import annotations

import asyncio

from phasegate.queue import Outgoing, Received
from phasegate.settings import load_settings
from phasegate.worker.fake_queue import InMemoryFifoQueue
from phasegate.worker.outcomes import Action, Settlement
from phasegate.worker.runtime import Worker
from phasegate.workflow import Registry


async def _worker_holding_one() -> tuple[Worker, Received, list[str]]:
    queue = InMemoryFifoQueue()
    await queue.send([Outgoing("a", "A", "d1")])
    (message,) = await queue.receive(1, 0, 30)
    worker = Worker(settings=load_settings(), registry=Registry(), queue=queue)
    worker._held[message.receipt_handle] = message
    deleted: list[str] = []

    async def delete(handle: str) -> None:
        deleted.append(handle)

    worker._delete = delete  # type: ignore[method-assign]
    return worker, message, deleted


async def _settling_with_a_send(worker: Worker, message: Received
                                ) -> tuple[asyncio.Event, asyncio.Future[bool],
                                           asyncio.Future[None]]:
    """The runtime settling ``message`` while its successor's send waits for the event."""
    may_finish = asyncio.Event()

    async def send() -> bool:
        await may_finish.wait()
        return True

    sending = asyncio.ensure_future(send())
    settling = asyncio.ensure_future(worker._settle(
        message, Settlement(Action.DELETE, "advanced", sending=sending)))
    return may_finish, sending, settling


async def test_the_received_message_is_deleted_while_the_successor_is_sent() -> None:
    worker, message, deleted = await _worker_holding_one()
    may_finish, _, settling = await _settling_with_a_send(worker, message)
    for _ in range(100):  # a few loop turns: the delete needs no more
        if deleted:
            break
        await asyncio.sleep(0)
    assert deleted == [message.receipt_handle]  # out while the send is still in flight
    assert not settling.done() and message.receipt_handle in worker._held  # slot still taken
    may_finish.set()
    await asyncio.wait_for(settling, timeout=5)
    assert message.receipt_handle not in worker._held


async def test_a_cancelled_settle_leaves_the_send_running() -> None:
    worker, message, _ = await _worker_holding_one()
    may_finish, sending, settling = await _settling_with_a_send(worker, message)
    await asyncio.sleep(0)
    settling.cancel()
    await asyncio.gather(settling, return_exceptions=True)
    assert not sending.cancelled()
    may_finish.set()
    assert await asyncio.wait_for(sending, timeout=5) is True


async def test_a_send_that_already_failed_still_frees_the_slot_after_the_delete() -> None:
    """The send ended before the runtime settles (with an error the transition did not catch):
    the delete still goes out, the failure is logged as the settle's, the slot is freed."""
    from structlog.testing import capture_logs

    worker, message, deleted = await _worker_holding_one()

    async def send() -> bool:
        raise RuntimeError("send lost")

    sending = asyncio.ensure_future(send())
    await asyncio.gather(sending, return_exceptions=True)
    with capture_logs() as logs:
        await worker._settle(message, Settlement(Action.DELETE, "advanced", sending=sending))
    assert deleted == [message.receipt_handle]
    assert message.receipt_handle not in worker._held
    assert [line["event"] for line in logs] == ["settle_failed"]
    assert logs[0]["action"] == "delete" and logs[0]["error"] == "RuntimeError"


def test_a_settlement_compares_without_its_send() -> None:
    assert Settlement(Action.DELETE, "advanced", sending=None) == Settlement(Action.DELETE,
                                                                             "advanced")
