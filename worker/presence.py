"""The worker's presence: a supervised side task that keeps this worker's row in
``worker_presence`` current (phasegate/presence.py), for the console's fleet page.

It writes every ``PHASEGATE_PRESENCE_INTERVAL_S`` and at once when the memory watchdog changes
state (worker/emergency.py). It can never stop or slow the worker: each write is bounded, and
a failed one (the database down, a pooler gone) is logged and tried again at the next tick;
the loop itself only ends when the worker cancels it. A worker that stops cleanly marks its
row stopped, so it leaves the fleet page at once; a killed one leaves it two intervals later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg
import structlog

from phasegate import presence
from phasegate.presence import PresenceReport, new_worker_id
from phasegate.residency import DEFAULT_REGION, StoreRouter

if TYPE_CHECKING:
    from phasegate.worker.emergency import EmergencyController
    from phasegate.worker.runtime import Worker

log = structlog.get_logger("phasegate.presence")

# A write waits at most this long (or one interval, when shorter): a hung database costs the
# worker one pool connection for that long, never a stuck task.
REPORT_TIMEOUT_S = 5.0
# The "stopped" mark on the way out, inside the worker's stop budget (STOP_FLUSH_S).
STOP_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class WorkerState:
    in_flight: int
    concurrency: int
    watchdog: str
    flushes: int
    last_flush_ago_s: float | None


class PresenceReporter:
    def __init__(self, pool: asyncpg.Pool, state: Callable[[], WorkerState], *,
                 interval_s: float, worker_id: str | None = None) -> None:
        self.pool = pool
        self.state = state
        self.interval_s = interval_s
        self.worker_id = worker_id or new_worker_id()
        self.timeout_s = min(REPORT_TIMEOUT_S, interval_s)
        self.reports = 0
        self.failures = 0
        self._started = time.monotonic()
        self._changed = asyncio.Event()

    def changed(self) -> None:
        """Write now (the watchdog changed state); safe to call from the loop thread only."""
        self._changed.set()

    async def run(self) -> None:
        try:
            while True:
                self._changed.clear()
                await self.report_once()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.interval_s)
        finally:
            await self._stopped()

    async def report_once(self) -> bool:
        state = self.state()
        row = PresenceReport(
            worker_id=self.worker_id, uptime_s=time.monotonic() - self._started,
            interval_s=self.interval_s, in_flight=state.in_flight,
            concurrency=state.concurrency, watchdog=state.watchdog, flushes=state.flushes,
            last_flush_ago_s=state.last_flush_ago_s)
        try:
            await asyncio.wait_for(presence.report(self.pool, row), self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failures += 1
            log.warning("presence_report_failed", error=type(exc).__name__,
                        retry_in_s=self.interval_s)
            return False
        self.reports += 1
        return True

    async def _stopped(self) -> None:
        # Best effort: a row not marked goes stale after two intervals anyway.
        with suppress(Exception):
            await asyncio.wait_for(presence.mark_stopped(self.pool, self.worker_id),
                                   STOP_TIMEOUT_S)


def reporter_for(worker: Worker, emergency: EmergencyController | None
                 ) -> PresenceReporter | None:
    """The worker's reporter (None with PHASEGATE_PRESENCE_INTERVAL_S=0). ``emergency``: the
    watchdog's controller, None when the watchdog stood down (state ``off``)."""
    interval = worker.settings.presence_interval_s
    store = worker.store
    if interval <= 0 or store is None:
        return None
    # With several stores the fleet is listed from the default one (the orchestrator's).
    pool = store.stores[DEFAULT_REGION].pool if isinstance(store, StoreRouter) else store.pool

    def state() -> WorkerState:
        return WorkerState(
            in_flight=worker.held, concurrency=worker.concurrency_limit,
            watchdog=emergency.state if emergency is not None else "off",
            flushes=emergency.flushes if emergency is not None else 0,
            last_flush_ago_s=emergency.last_flush_ago_s() if emergency is not None else None)

    reporter = PresenceReporter(pool, state, interval_s=interval)
    if emergency is not None:
        emergency.on_change = reporter.changed
    return reporter
