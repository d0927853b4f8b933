"""worker/deadlines.py: the phases of a worker share one timer for their time limits, and a limit
that expires behaves as ``asyncio.timeout`` did (PhaseTimeout, the cancellation withdrawn, a
shutdown's cancellation left alone)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from phasegate.worker.deadlines import PhaseDeadlines
from phasegate.worker.guards import PhaseTimeout, call_phase
from phasegate.workflow import Workflow

WF = Workflow("deadlines")


@WF.phase("hangs")
async def hangs(ctx: Any, state: Any) -> Any:
    await asyncio.Event().wait()


@WF.phase("waits")
async def waits(ctx: Any, state: asyncio.Event) -> Any:
    await state.wait()
    return "done"


@WF.phase("swallows")
async def swallows(ctx: Any, state: Any) -> Any:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        return "kept going"


@WF.phase("own_timeout")
async def own_timeout(ctx: Any, state: Any) -> Any:
    raise TimeoutError("the phase's own")


HANGS, WAITS, SWALLOWS, OWN = (WF.get_phase(name) for name in (
    "hangs", "waits", "swallows", "own_timeout"))


async def _run(deadlines: PhaseDeadlines, phase: Any, state: Any, limit_s: float
               ) -> tuple[Any, int]:
    """The phase's result (or exception) and its task's pending cancellations afterwards."""
    try:
        result: Any = await call_phase(phase, None, state, limit_s, deadlines)  # type: ignore[arg-type]
    except Exception as exc:
        result = exc
    task = asyncio.current_task()
    assert task is not None
    return result, task.cancelling()


async def test_phases_sharing_the_timer_time_out_alone_and_leave_nothing_behind():
    deadlines = PhaseDeadlines()
    release = asyncio.Event()
    # A long limit started first, then a short one: the timer moves to the earlier deadline.
    slow = asyncio.create_task(_run(deadlines, WAITS, release, 60.0))
    hung = asyncio.create_task(_run(deadlines, HANGS, None, 0.05))
    other = asyncio.create_task(_run(deadlines, WAITS, release, 60.0))
    timed_out, cancelling = await hung
    assert isinstance(timed_out, PhaseTimeout)
    assert str(timed_out) == "phase hangs ran longer than 0.05s"
    assert cancelling == 0
    assert not slow.done() and not other.done()  # their limits are a minute away
    release.set()
    assert await slow == ("done", 0)
    assert await other == ("done", 0)
    assert deadlines.running == 0


async def test_a_phase_that_swallows_the_cancellation_returns_with_it_withdrawn():
    deadlines = PhaseDeadlines()
    assert await _run(deadlines, SWALLOWS, None, 0.05) == ("kept going", 0)
    assert deadlines.running == 0


async def test_the_phases_own_timeout_error_is_an_ordinary_failure():
    raised, _ = await _run(PhaseDeadlines(), OWN, None, 10.0)
    assert isinstance(raised, TimeoutError) and not isinstance(raised, PhaseTimeout)


@WF.phase("enters")
async def enters(ctx: Any, state: asyncio.Event) -> Any:
    state.set()
    await asyncio.Event().wait()


@WF.phase("swallows_once")
async def swallows_once(ctx: Any, state: asyncio.Event) -> Any:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:  # the limit's: it keeps going, until the shutdown's
        state.set()
        await asyncio.Event().wait()


async def test_a_shutdown_cancel_stays_a_cancel_before_and_after_the_limit():
    deadlines = PhaseDeadlines()
    # Within the limit ("enters" signals once running), and after the limit expired
    # ("swallows_once" signals once the limit's cancellation reached it): the worker's
    # cancel is a cancel, not a PhaseTimeout.
    for phase, limit_s in (("enters", 60.0), ("swallows_once", 0.05)):
        reached = asyncio.Event()
        task = asyncio.create_task(call_phase(
            WF.get_phase(phase), None, reached, limit_s, deadlines))  # type: ignore[arg-type]
        await reached.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert deadlines.running == 0
