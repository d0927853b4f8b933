"""The queue-depth exporter: what an HPA External metric (via prometheus-adapter) scales on.

Every few seconds it reads the queue's (and the dead-letter queue's) Approximate* attributes,
the age of the oldest unfinished run, the number of runs in each status and the number of
waits falling due within the next minute (the fleet wakes before a timer). A failed poll is
logged and counted and the last good value stays exported (an HPA holds its scale on a missing
metric too); the loop itself never dies of it.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

import structlog
from prometheus_client import Counter, Gauge

from phasegate.orchestrator.views import Views
from phasegate.queue import Queue, QueueDepth

log = structlog.get_logger("phasegate.exporter")

# The Helm chart's HPA and prometheus-adapter rules name this metric: do not rename it.
QUEUE_MESSAGES = Gauge(
    "phasegate_queue_messages",
    "Messages in the work queue by state (SQS Approximate* attributes).", ["state"])
OLDEST_UNFINISHED = Gauge(
    "phasegate_oldest_unfinished_run_age_seconds",
    "Age of the oldest pending, running or awaiting_review run (database time).")
DLQ_MESSAGES = Gauge(
    "phasegate_dlq_messages",
    "Messages in the dead-letter queue by state (SQS Approximate* attributes).", ["state"])
RUNS = Gauge("phasegate_runs", "Workflow runs by status (database).", ["status"])
RUN_STATUSES = ("pending", "running", "awaiting_review", "completed", "failed", "cancelled",
                "needs_restart", "queued", "waiting")
# The chart's scale-from-zero trigger names this metric: waits (timers, signal timeouts) due
# and races' deadlines within the next WAKE_AHEAD_S seconds, so the fleet is awake when they
# fire, not after.
WAKE_AHEAD_S = 60.0
TIMERS_DUE_SOON = Gauge(
    "phasegate_timers_due_soon",
    "Waiting runs whose next phase falls due within the next 60 seconds, or is overdue, "
    "queued runs' rate-limit wake-ups and open races' deadlines as soon (database time).")
EXPORTER_ERRORS = Counter(
    "phasegate_exporter_errors_total", "Exporter polls that failed, by source.", ["source"])
EXPORTER_POLLS = Counter("phasegate_exporter_polls_total", "Exporter poll rounds.")

for _state in ("visible", "inflight", "delayed"):
    QUEUE_MESSAGES.labels(_state)
    DLQ_MESSAGES.labels(_state)
for _status in RUN_STATUSES:
    RUNS.labels(_status)
for _source in ("queue", "dlq", "database"):
    EXPORTER_ERRORS.labels(_source)


class QueueDepthExporter:
    def __init__(self, *, queue: Queue | None, views: Views | None,
                 interval_s: float = 5.0, dlq: Queue | None = None) -> None:
        self.queue = queue
        self.dlq = dlq
        self.views = views
        self.interval_s = interval_s
        self.last_depth: QueueDepth | None = None
        self.last_error: str | None = None
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        log.info("exporter_started", interval_s=self.interval_s)
        while not self._stop.is_set():
            await self.poll_once()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
        log.info("exporter_stopped")

    async def poll_once(self) -> None:
        """One round: queue attributes, then the oldest unfinished run. Never raises."""
        EXPORTER_POLLS.inc()
        if self.queue is not None:
            try:
                depth = await self.queue.depth()
            except Exception as exc:
                self._failed("queue", exc)
            else:
                self.last_depth = depth
                QUEUE_MESSAGES.labels("visible").set(depth.visible)
                QUEUE_MESSAGES.labels("inflight").set(depth.inflight)
                QUEUE_MESSAGES.labels("delayed").set(depth.delayed)
        if self.dlq is not None:
            try:
                dlq = await self.dlq.depth()
            except Exception as exc:
                self._failed("dlq", exc)
            else:
                DLQ_MESSAGES.labels("visible").set(dlq.visible)
                DLQ_MESSAGES.labels("inflight").set(dlq.inflight)
                DLQ_MESSAGES.labels("delayed").set(dlq.delayed)
        if self.views is not None:
            try:
                OLDEST_UNFINISHED.set(await self.views.oldest_unfinished_age_s())
                counts = await self.views.runs_by_status()
                TIMERS_DUE_SOON.set(await self.views.timers_due_soon(WAKE_AHEAD_S))
            except Exception as exc:
                self._failed("database", exc)
            else:
                for status in sorted(set(RUN_STATUSES) | set(counts)):
                    RUNS.labels(status).set(counts.get(status, 0))

    def _failed(self, source: str, exc: Exception) -> None:
        EXPORTER_ERRORS.labels(source).inc()
        self.last_error = f"{source}: {type(exc).__name__}: {exc}"[:300]
        log.warning("exporter_poll_failed", source=source, error=self.last_error)
