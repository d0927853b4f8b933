"""How a transition ends: the settlement the runtime applies to the received message, and the
one canonical log line (with its duration metric) per phase.

Shared by the transition and the side parts it hands work to (worker/failures.py,
worker/poison.py, worker/duplicates.py, worker/branching.py, worker/continuation.py), so none
of them imports the transition itself.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import field
from enum import Enum
from typing import Any, Protocol

from phasegate import metrics
from phasegate.envelope import Envelope
from phasegate.logs import lean_logger
from phasegate.records import record
from phasegate.store import OutboxRow


class Action(Enum):
    DELETE = "delete"
    RELEASE = "release"


@record
class Settlement:
    action: Action
    outcome: str
    visibility_s: int = 0
    # The successor's send, still in flight: the runtime deletes the received message
    # meanwhile (the committed outbox row stands for the successor whatever becomes of the
    # send) and waits for both, so a slot is freed only when the hop's SQS work is done.
    sending: asyncio.Future[bool] | None = field(default=None, compare=False)


class Emit(Protocol):
    """Step 5 (``Emitter.emit``, worker/emitter.py): send a committed outbox row, mark it sent."""

    async def __call__(self, row: OutboxRow, committed: float | None = None) -> bool: ...


class PhaseLog:
    """The one line per phase (``phase``) and its duration, labelled by outcome."""

    def __init__(self, logger: Any) -> None:
        # Bound once, from the logging configuration in force when the worker is made:
        # structlog's module-level proxy rebuilds its bound logger on every call, half the
        # cost of the line (~35 -> ~18 us, measured in bench/); under phasegate's JSON
        # pipeline the line is written without the processor chain (a third less again).
        self._log = lean_logger(logger)

    def __call__(self, envelope: Envelope, phase_name: str, started: float, outcome: str,
                 **extra: Any) -> None:
        duration = time.monotonic() - started
        metrics.child(metrics.PHASE_DURATION, envelope.workflow, phase_name,
                      outcome).observe(duration)
        self._log.info("phase", phase=phase_name, outcome=outcome,
                       duration_s=round(duration, 6), **extra)
