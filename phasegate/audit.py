"""The audit trail of checkpoint writes: one structlog event and one counter per write.

Emitted by the store layer (``phasegate/residency.py``) after a checkpoint commits, so no caller
can forget it. The event names the run (workflow id, seq, region, classification); the counter
is labelled by region, classification and kind only -- never by workflow id.
"""

from __future__ import annotations

import structlog
from prometheus_client import Counter

log = structlog.get_logger("phasegate.audit")

CHECKPOINT_WRITES = Counter(
    "phasegate_checkpoint_writes_total",
    "Checkpoints committed, by the run's region (store), classification and checkpoint kind.",
    ["region", "classification", "kind"])


def checkpoint_written(*, workflow_id: str, seq: int, branch: str, region: str,
                       classification: str, kind: str = "phase") -> None:
    """Record one committed checkpoint (after the commit: never for a rolled-back one)."""
    CHECKPOINT_WRITES.labels(region, classification, kind).inc()
    log.info("checkpoint_audit", workflow_id=workflow_id, seq=seq,
             branch=branch, region=region, classification=classification, kind=kind)
