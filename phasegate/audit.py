"""The audit trail of checkpoint writes: one structlog event and one counter per write.

Emitted by the store layer (``phasegate/residency.py``) after a checkpoint commits, so no caller
can forget it. The event names the run (workflow id, seq, region, classification); the counter
is labelled by region, classification and kind only -- never by workflow id.
"""

from __future__ import annotations

from typing import Any

import structlog
from prometheus_client import Counter

from phasegate import metrics
from phasegate.logs import lean_logger

log = structlog.get_logger("phasegate.audit")

CHECKPOINT_WRITES = Counter(
    "phasegate_checkpoint_writes_total",
    "Checkpoints committed, by the run's region (store), classification and checkpoint kind.",
    ["region", "classification", "kind"])


def bound_logger() -> Any:
    """The audit logger bound once, from the logging configuration in force now: a store
    makes one when it is made. Through the module's proxy, structlog rebuilds its bound logger
    on every line, a third of the line's cost and one line per commit; under phasegate's JSON
    pipeline the line is written without the processor chain (``logs.lean_logger``)."""
    return lean_logger(log)


def checkpoint_written(*, workflow_id: str, seq: int, branch: str, region: str,
                       classification: str, kind: str = "phase",
                       logger: Any = None) -> None:
    """Record one committed checkpoint (after the commit: never for a rolled-back one).
    ``logger``: a ``bound_logger()`` (default: the module's proxy)."""
    metrics.child(CHECKPOINT_WRITES, region, classification, kind).inc()
    (logger or log).info("checkpoint_audit", workflow_id=workflow_id, seq=seq,
                         branch=branch, region=region, classification=classification,
                         kind=kind)
