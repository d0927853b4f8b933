"""The time limits of the phases a worker runs, kept by one timer.

``asyncio.timeout`` schedules a timer when a phase starts and cancels it when the phase ends:
a timer handle, a push onto the event loop's heap and a cancelled entry left in it, for every
phase (a no-op phase in a loop: 4.1 µs under ``asyncio.timeout``, 1.4 µs under these deadlines,
0.2 µs with no limit; ``python -m bench.hops``).
Here a worker's phases share one timer, set for the earliest deadline among them. A phase that
starts later under the same limit ends later, so starting a phase almost never moves the
timer, and ending one never does. When the timer fires it cancels every phase past its
deadline and is set again for the next one still running.

A limit that expires works as ``asyncio.timeout``'s does: the phase's task is cancelled; if
the phase lets the cancellation through, the attempt raises ``PhaseTimeout`` instead; the
cancellation request is withdrawn on the way out whatever the phase did with it; and a
cancellation of the worker's own (shutdown) that arrives meanwhile stays a cancellation.
"""

from __future__ import annotations

import asyncio
import math


class Limit:
    """One phase attempt's deadline (event loop time)."""

    __slots__ = ("cancelling", "deadline", "expired", "task")

    def __init__(self, task: asyncio.Task[object], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        # Cancellation requests the task had when the phase started: its own, or the worker's.
        self.cancelling = task.cancelling()
        self.expired = False

    def withdraw(self) -> bool:
        """After an expired limit's cancellation reached the phase (or was swallowed by it):
        withdraw it; True when no other cancellation is pending (the attempt timed out)."""
        return self.task.uncancel() <= self.cancelling


class PhaseDeadlines:
    """The deadlines of the phases running in one event loop; see the module docstring."""

    def __init__(self) -> None:
        self._running: dict[Limit, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, limit_s: float) -> Limit:
        """The limit of the phase the running task starts now."""
        loop = self.event_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        limit = Limit(task, loop.time() + limit_s)
        self._running[limit] = None
        if limit.deadline < self._timer_at:
            self._set_timer(loop, limit.deadline)
        return limit

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The worker's event loop, looked up once: ``asyncio.get_running_loop()``, and
        ``asyncio.current_task()`` without a loop, make a getpid() system call on every call
        (CPython 3.11)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def end(self, limit: Limit) -> None:
        self._running.pop(limit, None)

    @property
    def running(self) -> int:
        """Phases with a limit now (tests read it)."""
        return len(self._running)

    def _set_timer(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._expire)
        self._timer_at = when

    def _expire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        loop = self.event_loop()
        now = loop.time()
        nearest = math.inf
        for limit in self._running:
            if limit.expired:
                continue
            if limit.deadline <= now:
                limit.expired = True
                limit.task.cancel()
            else:
                nearest = min(nearest, limit.deadline)
        if nearest < math.inf:
            self._set_timer(loop, nearest)
