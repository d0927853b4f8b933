"""Retention: delete finished runs (completed, failed, cancelled) older than an age, with their
checkpoints and outbox rows, in batches so no statement holds many locks for long.

A run's own ``retention`` (when set) can only keep it longer than the global age.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta

import asyncpg
import structlog

from orchestrator.sql import queries

log = structlog.get_logger("phasegate.purge")

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``7d``, ``2w`` -> timedelta. Raises ValueError."""
    match = _AGE.match(text.lower())
    if not match:
        raise ValueError(f"{text!r} is not an age like 7d, 12h, 30m, 90s or 2w")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


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
                dry_run: bool = False, max_batches: int | None = None) -> PurgeReport:
    """Delete (or with ``dry_run`` count) what retention allows; returns the totals."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    q = queries()
    report = PurgeReport(dry_run=dry_run, older_than=older_than)
    if dry_run:
        row = await pool.fetchrow(q["purge_count"], older_than)
        assert row is not None
        report.runs, report.checkpoints, report.outbox = (
            row["runs"], row["checkpoints"], row["outbox"])
        return report
    while max_batches is None or report.batches < max_batches:
        row = await pool.fetchrow(q["purge_batch"], older_than, batch_size)
        assert row is not None
        if row["runs"] == 0:
            break
        report.batches += 1
        report.batch_sizes.append(row["runs"])
        report.runs += row["runs"]
        report.checkpoints += row["checkpoints"]
        report.outbox += row["outbox"]
        log.info("purged_batch", runs=row["runs"], checkpoints=row["checkpoints"],
                 outbox=row["outbox"])
        if row["runs"] < batch_size:
            break
    return report
