"""Messages the transition cannot or must not run: the quarantine (DLQ + a row with a reason,
no payload data, then delete) and the transition's own crashes (counted per message, retried,
then quarantined with the run failed, never a loop)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import structlog

from phasegate import metrics, redact, residency, tracing
from phasegate.envelope import Envelope, state_hash
from phasegate.queue import Outgoing, Queue, QueueError, Received
from phasegate.store import Store
from phasegate.worker.guards import MAX_TRANSITION_CRASHES
from phasegate.worker.outcomes import Action, Settlement
from phasegate.worker.parsing import Poison
from phasegate.workflow import Workflow

log = structlog.get_logger("phasegate.transition")


class Quarantine:
    def __init__(self, *, store: Store, dlq: Queue, worker_id: str,
                 parse: Callable[[Received], tuple[Envelope, Workflow] | Poison],
                 backoff: Callable[[int], int]) -> None:
        self.store = store
        self.dlq = dlq
        self.worker_id = worker_id
        self._parse = parse
        self._backoff = backoff

    async def quarantine(self, message: Received, poison: Poison) -> Settlement:
        """DLQ + a quarantine row with a reason (no payload data), then delete."""
        body_bytes = len(message.body.encode())
        try:
            with tracing.send_span("dlq"):
                # Never the input or unknown fields: see phasegate/redact.py.
                await self.dlq.send([Outgoing(
                    redact.dlq_body(message.body, poison.code),
                    message.group_id or "quarantine",
                    state_hash(f"quarantine:{message.message_id}"))])
        except QueueError as exc:
            metrics.SQS_ERRORS.labels("dlq_send").inc()
            log.error("quarantine_dlq_send_failed", error=str(exc))
            return Settlement(Action.RELEASE, "quarantine_retry", self._backoff(1))
        await self.store.quarantine(
            message_id=message.message_id, workflow_id=poison.workflow_id, reason=poison.reason,
            body_bytes=body_bytes, worker_id=self.worker_id)
        log.warning("quarantined", code=poison.code, reason=poison.reason,
                    message_id=message.message_id, quarantined_workflow_id=poison.workflow_id)
        return Settlement(Action.DELETE, "quarantined")

    async def crashed(self, message: Received, exc: BaseException) -> Settlement:
        """The transition itself raised (a bug, or user code outside a phase: an upcaster):
        counted per message, retried, then quarantined with its run failed (never a loop)."""
        described = redact.describe(exc)
        log.error("transition_crashed", **described)
        parsed = self._parse(message)
        envelope = parsed[0] if isinstance(parsed, tuple) else None
        with residency.route(self.store, envelope) if envelope else nullcontext():
            crashes = await self.store.count_crash(message.message_id, described["error_type"])
            if crashes < MAX_TRANSITION_CRASHES:
                return Settlement(Action.RELEASE, "crashed", self._backoff(crashes))
            why = f"{described['error']} on {crashes} deliveries"
            settlement = await self.quarantine(message, Poison(
                "transition_crashed", why, envelope.workflow_id if envelope else None))
            if envelope is not None and settlement.action is Action.DELETE:  # else: it retries
                await self.store.fail_run(envelope.workflow_id, f"transition_crashed: {why}; "
                                          "the message was quarantined")
        return settlement
