from __future__ import annotations

import asyncio

import pytest

from phasegate.batcher import MicroBatcher
from phasegate.faults import Faults
from phasegate.queue import Outgoing, QueueError
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


async def test_a_lone_submit_is_called_from_its_callers_task():
    """Nothing queued or in flight: the call is made in the submitting task (no queue hop and
    no call task); what comes meanwhile queues and goes together in the next call."""
    release, called = asyncio.Event(), asyncio.Event()
    calls: list[tuple[list[int], asyncio.Task[object] | None]] = []

    async def flush(items):
        calls.append((list(items), asyncio.current_task()))
        called.set()
        if len(calls) == 1:
            await release.wait()

    batcher = MicroBatcher[int](flush, max_concurrent=1)
    runner = asyncio.create_task(batcher.run())
    first = asyncio.create_task(batcher.submit(0))
    await asyncio.wait_for(called.wait(), timeout=10)
    later = [asyncio.create_task(batcher.submit(i)) for i in (1, 2, 3)]
    for _ in range(5):  # turns of the loop in which the side task could (wrongly) call
        await asyncio.sleep(0)
    assert [items for items, _ in calls] == [[0]]  # the others wait for the slot
    release.set()
    await asyncio.gather(first, *later)
    assert calls[0][1] is first
    assert [items for items, _ in calls] == [[0], [1, 2, 3]]
    assert calls[1][1] is not first and calls[1][1] not in later  # the side task's call
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


async def test_a_lone_submit_cancelled_mid_call_is_made_again_by_the_side_task():
    """A hard stop cancels a delete in flight: the item is queued again and the side task
    makes the call (every call here may be repeated), so a cancel loses nothing."""
    calls: list[list[str]] = []
    hang, first_call, second_call = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def flush(items):
        calls.append(list(items))
        (first_call if len(calls) == 1 else second_call).set()
        if len(calls) == 1:
            await hang.wait()  # never set: the first call is cut short by the cancel

    batcher = MicroBatcher[str](flush)
    runner = asyncio.create_task(batcher.run())
    caller = asyncio.create_task(batcher.submit("receipt"))
    await asyncio.wait_for(first_call.wait(), timeout=10)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(second_call.wait(), timeout=10)
    assert calls == [["receipt"], ["receipt"]]
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)


def test_faults_parse_and_refuse_unknown_points():
    assert not Faults("").active
    assert Faults("after_commit@2,after_send%0.5").active
    with pytest.raises(ValueError, match="unknown fault point"):
        Faults("before_lunch")
