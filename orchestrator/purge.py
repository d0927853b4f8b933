"""Retention: delete finished runs (completed, failed, cancelled) older than an age, with their
checkpoints and outbox rows, in batches so no statement holds many locks for long.

A run's own ``retention`` (when set) can only keep it longer than the global age. With
``PHASEGATE_RETENTION_BY_CLASSIFICATION`` each classification has its own age
(``purge_by_classification``), applied in every regional store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import asyncpg
import structlog

from phasegate.retention import parse_age, parse_retention
from phasegate.sql import queries

log = structlog.get_logger("phasegate.purge")

__all__ = ["PurgeReport", "parse_age", "parse_retention", "purge"]

@dataclass
class PurgeReport:
    dry_run: bool
    older_than: timedelta
    runs: int = 0
    checkpoints: int = 0
    outbox: int = 0
    batches: int = 0
    batch_sizes: list[int] = field(default_factory=list)


async def purge(pool: asyncpg.Pool, older_than: timedelta, *, batch_size: int = 500,
                dry_run: bool = False, max_batches: int | None = None,
                classification: str | None = None) -> PurgeReport:
    """Delete (or with ``dry_run`` count) what retention allows; returns the totals. With
    ``classification``, only runs of that classification."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    q = queries("control.sql")
    report = PurgeReport(dry_run=dry_run, older_than=older_than)
    if dry_run:
        row = await pool.fetchrow(q["purge_count"], older_than, classification)
        assert row is not None
        report.runs, report.checkpoints, report.outbox = (
            row["runs"], row["checkpoints"], row["outbox"])
        return report
    while max_batches is None or report.batches < max_batches:
        row = await pool.fetchrow(q["purge_batch"], older_than, batch_size, classification)
        assert row is not None
        if row["runs"] == 0:
            break
        report.batches += 1
        report.batch_sizes.append(row["runs"])
        report.runs += row["runs"]
        report.checkpoints += row["checkpoints"]
        report.outbox += row["outbox"]
        log.info("purged_batch", classification=classification, runs=row["runs"],
                 checkpoints=row["checkpoints"], outbox=row["outbox"])
        if row["runs"] < batch_size:
            break
    return report


async def purge_by_classification(pool: asyncpg.Pool, ages: dict[str, timedelta], *,
                                  batch_size: int = 500, dry_run: bool = False
                                  ) -> dict[str, PurgeReport]:
    """One purge per classification, each with its own age."""
    return {classification: await purge(pool, age, batch_size=batch_size, dry_run=dry_run,
                                        classification=classification)
            for classification, age in sorted(ages.items())}
