"""One heartbeat: extend the visibility of every message the worker holds, and the outbox
leases of its local chains, so the visibility timeout can stay short and a dead worker's
message (or chain) comes back in seconds.

The worker runs it every ``PHASEGATE_HEARTBEAT_S`` as a supervised side task
(worker/runtime.py); nothing here ever ends the worker: a failed extension only lets a lease
run out, and the commit condition keeps the redelivery from doubling the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import structlog

from phasegate import metrics
from phasegate.queue import Queue, QueueError, Received
from phasegate.worker.continuation import Leases

log = structlog.get_logger("phasegate.worker")


async def extend_leases(leases: Leases | None, timeout_s: float) -> None:
    """The outbox leases of local chains live as long as their held messages do."""
    if leases is None or not leases.held:
        return
    try:
        # Bounded: a database outage must not hold up the SQS visibility extensions.
        await asyncio.wait_for(leases.extend(), timeout_s)
    except Exception as exc:  # a lease that runs out only hands the run to another worker
        metrics.DB_ERRORS.inc()
        log.warning("lease_heartbeat_failed", error=type(exc).__name__)


async def extend_visibility(queue: Queue, held: Mapping[str, Received],
                            visibility_s: int) -> None:
    """``held`` is the worker's live map: read again after the call, so a handle settled
    while the call was on its way is not reported as lost."""
    handles = list(held)
    if not handles:
        return
    try:
        await queue.change_visibility([(h, visibility_s) for h in handles])
        metrics.HEARTBEATS.inc(len(handles))
    except QueueError as exc:
        # A handle settled (deleted) while the call was on its way fails too: that is no
        # lost lease. One still held is: the message went back and may be taken elsewhere,
        # and the commit condition keeps that delivery from doubling the work.
        lost = [h for h in exc.failed if h in held]
        if lost:
            log.warning("heartbeat_partial", failed=len(lost))
    except Exception as exc:
        metrics.SQS_ERRORS.labels("heartbeat").inc()
        log.warning("heartbeat_failed", error=type(exc).__name__)
