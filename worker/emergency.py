"""The emergency flush: what the worker does, on its event loop, when the watchdog warns.

1. Pause receiving.
2. Commit an ``emergency`` checkpoint for every running phase that published progress
   (``ctx.progress(state)``) since the last flush. It never moves the run's seq, is written
   only while the run is at that seq, and is superseded by the phase checkpoint; a phase
   restarted elsewhere reads it back as ``ctx.resumed_progress``.
3. Hand prefetched, not-yet-started messages back with visibility 0, so another worker
   takes them at once instead of this one dying with them.
4. Lower concurrency to ``reduced_concurrency`` and resume receiving (or stay paused at 0);
   when the watchdog reports pressure over (hysteresis), restore concurrency.

Nothing here is needed for correctness: a worker killed without a flush loses at most the
phase it was running, as always. The flush only makes that loss smaller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog
from prometheus_client import Counter, Histogram

from phasegate.worker.watchdog import PressureEvent, WatchdogSettings

if TYPE_CHECKING:
    from phasegate.worker.runtime import Worker

log = structlog.get_logger("phasegate.emergency")

FLUSHES = Counter("phasegate_emergency_flush_total",
                  "Emergency flushes by what triggered them.", ["reason"])
FLUSH_DURATION = Histogram(
    "phasegate_emergency_flush_duration_seconds",
    "From the pressure event on the loop to every emergency checkpoint committed.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
EMERGENCY_CHECKPOINTS = Counter(
    "phasegate_emergency_checkpoints_total",
    "Emergency checkpoints by outcome (committed, superseded: the run had moved on, failed).",
    ["outcome"])
SHED = Counter("phasegate_emergency_shed_messages_total",
               "Prefetched messages handed back (visibility 0) by emergency flushes.")


class WatchdogCrashed(RuntimeError):
    """The watchdog thread died of a bug; the worker stops loudly (side-task rule)."""


class EmergencyController:
    """Receives watchdog events on the loop and runs flushes one at a time."""

    def __init__(self, worker: Worker, settings: WatchdogSettings) -> None:
        self.worker = worker
        self.settings = settings
        self._events: asyncio.Queue[PressureEvent] = asyncio.Queue()
        # (dedup id of the running phase) -> progress version already persisted.
        self._persisted: dict[str, int] = {}
        self.reduced = False
        self.flushes = 0
        self.flushing = False
        self._last_flush: float | None = None
        # Told of every state change (worker/presence.py reports it at once).
        self.on_change: Callable[[], None] | None = None

    @property
    def state(self) -> str:
        """What the fleet page shows (phasegate/presence.py): flushing, pressure or ok."""
        if self.flushing:
            return "flushing"
        return "pressure" if self.reduced else "ok"

    def last_flush_ago_s(self) -> float | None:
        return None if self._last_flush is None else time.monotonic() - self._last_flush

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def submit(self, event: PressureEvent) -> None:
        """The watchdog's ``call_soon_threadsafe`` target: runs on the loop thread."""
        self._events.put_nowait(event)

    async def run(self) -> None:
        """Supervised side task: handle events in order until cancelled."""
        while True:
            event = await self._events.get()
            if event.kind == "crashed":
                raise WatchdogCrashed(f"watchdog thread died: {event.reason}")
            if event.kind == "release":
                self.release(event)
            else:
                await self.flush(event)

    async def flush(self, event: PressureEvent) -> None:
        started = time.monotonic()
        worker = self.worker
        worker.pause_receiving()
        self.flushing = True
        self._changed()
        try:
            committed = await asyncio.shield(self._checkpoint_running())
            shed = await worker.shed_unstarted()
        finally:
            self.flushing = False
            if not worker.stopping:
                worker.set_concurrency(self._reduced_limit())
                self.reduced = True
                if self.settings.reduced_concurrency > 0:
                    worker.resume_receiving()
        duration = time.monotonic() - started
        self.flushes += 1
        self._last_flush = time.monotonic()
        self._changed()
        FLUSHES.labels(event.reason).inc()
        FLUSH_DURATION.observe(duration)
        SHED.inc(shed)
        log.warning("emergency_flush", reason=event.reason, checkpoints=committed,
                    handed_back=shed, duration_s=round(duration, 6),
                    event_at=event.at, lag_s=round(time.time() - event.at, 6),
                    concurrency=worker.concurrency_limit, **event.detail)

    def release(self, event: PressureEvent) -> None:
        if not self.reduced:
            return
        self.reduced = False
        self.worker.set_concurrency(self.worker.settings.concurrency)
        self.worker.resume_receiving()
        self._changed()
        log.info("pressure_released", concurrency=self.worker.concurrency_limit, **event.detail)

    def _reduced_limit(self) -> int:
        return max(1, min(self.settings.reduced_concurrency, self.worker.settings.concurrency))

    async def _checkpoint_running(self) -> int:
        """One emergency checkpoint per running phase with unsaved progress, concurrently."""
        transition, store = self.worker.transition, self.worker.store
        if transition is None or store is None:
            return 0
        running = dict(transition.running)
        self._persisted = {k: v for k, v in self._persisted.items() if k in running}
        writes = []
        for key, phase in running.items():
            version, progress = phase.ctx.latest_progress
            if version == 0 or self._persisted.get(key) == version:
                continue
            ctx = phase.ctx
            writes.append((key, version, store.emergency_checkpoint(
                workflow_id=ctx.workflow_id, branch=ctx.branch, seq=ctx.seq, phase=ctx.phase,
                schema_version=ctx.schema_version, state=progress,
                worker_id=ctx.worker_id)))
        results = await asyncio.gather(*(w[2] for w in writes), return_exceptions=True)
        committed = 0
        for (key, version, _), result in zip(writes, results, strict=True):
            if isinstance(result, BaseException):
                EMERGENCY_CHECKPOINTS.labels("failed").inc()
                log.warning("emergency_checkpoint_failed", error=type(result).__name__)
            elif result:
                self._persisted[key] = version
                committed += 1
                EMERGENCY_CHECKPOINTS.labels("committed").inc()
            else:
                EMERGENCY_CHECKPOINTS.labels("superseded").inc()
        return committed
