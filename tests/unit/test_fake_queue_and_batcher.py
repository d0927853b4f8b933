from __future__ import annotations

import asyncio

import pytest

from phasegate.faults import Faults
from phasegate.queue import Outgoing, QueueError
from phasegate.worker.batcher import MicroBatcher
from phasegate.worker.fake_queue import InMemoryFifoQueue


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_fifo_holds_back_a_group_while_a_message_is_in_flight():
    clock = Clock()
    queue = InMemoryFifoQueue(clock=clock)
    await queue.send([Outgoing("a1", "A", "d1"), Outgoing("a2", "A", "d2"),
                      Outgoing("b1", "B", "d3")])
    first = await queue.receive(10, 0, 30)
    assert [m.body for m in first] == ["a1", "b1"]
    assert await queue.receive(10, 0, 30) == []
    await queue.delete([first[0].receipt_handle])
    assert [m.body for m in await queue.receive(10, 0, 30)] == ["a2"]


async def test_dedup_window_and_visibility_timeout():
    clock = Clock()
    queue = InMemoryFifoQueue(clock=clock)
    await queue.send([Outgoing("x", "G", "same")])
    await queue.send([Outgoing("x-again", "G", "same")])
    assert (await queue.depth()).visible == 1
    taken = await queue.receive(1, 0, 30)
    clock.now = 31
    again = await queue.receive(1, 0, 30)
    assert again[0].message_id == taken[0].message_id and again[0].receive_count == 2
    clock.now = 400
    await queue.send([Outgoing("x-later", "H", "same")])  # window passed: accepted
    assert (await queue.depth()).visible + (await queue.depth()).inflight == 2
    with pytest.raises(QueueError):
        await queue.change_visibility([("bogus", 0)])


async def test_batcher_coalesces_concurrent_submissions():
    batches: list[list[int]] = []

    async def flush(items):
        batches.append(list(items))
        await asyncio.sleep(0)

    batcher = MicroBatcher[int](flush, max_size=10, max_concurrent=1)
    runner = asyncio.create_task(batcher.run())
    await asyncio.gather(*(batcher.submit(i) for i in range(25)))
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    assert sorted(i for b in batches for i in b) == list(range(25))
    assert all(len(b) <= 10 for b in batches) and len(batches) < 25


async def test_batcher_hands_the_error_to_every_waiter_and_lives_on():
    calls = {"n": 0}

    async def flush(items):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("sqs down")

    batcher = MicroBatcher[int](flush)
    runner = asyncio.create_task(batcher.run())
    with pytest.raises(RuntimeError):
        await batcher.submit(1)
    await batcher.submit(2)
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


async def test_batcher_tells_a_submitter_when_its_call_is_under_way():
    """``issued`` is set as the call carrying the item starts, before it ends: the transition
    starts the received message's delete then, not before the successor's send request."""
    release = asyncio.Event()
    started: list[list[str]] = []

    async def flush(items):
        started.append(list(items))
        await release.wait()

    batcher = MicroBatcher[str](flush)
    runner = asyncio.create_task(batcher.run())
    issued = asyncio.get_running_loop().create_future()
    sending = asyncio.create_task(batcher.submit("successor", issued))
    await issued
    assert started == [["successor"]] and not sending.done()
    release.set()
    await sending
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


def test_faults_parse_and_refuse_unknown_points():
    assert not Faults("").active
    assert Faults("after_commit@2,after_send%0.5").active
    with pytest.raises(ValueError, match="unknown fault point"):
        Faults("before_lunch")
