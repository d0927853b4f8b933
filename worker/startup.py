"""What a starting worker refuses: errors that waiting cannot fix end it at once (exit 2)."""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg
import structlog

from phasegate.limits import fifo_quota
from phasegate.migrate import schema_version
from phasegate.sql import migration_files
from phasegate.store import Store

__all__ = ["PERMANENT_DB_ERRORS", "PermanentStartupError", "StartupError", "check_schema",
           "log_fifo_quota", "one_line"]

log = structlog.get_logger("phasegate.worker")


class StartupError(Exception):
    """The worker could not reach what it needs before the startup timeout."""


class PermanentStartupError(StartupError):
    """What the worker needs answers but cannot work (exit 2): waiting would not help."""


# asyncpg's errors that retrying cannot fix: a wrong password or user, a missing database.
PERMANENT_DB_ERRORS = (asyncpg.InvalidPasswordError,
                       asyncpg.InvalidAuthorizationSpecificationError,
                       asyncpg.InvalidCatalogNameError)


def one_line(exc: BaseException) -> str:
    """An error as one line (asyncpg's messages may span several)."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


async def check_schema(store: Store) -> None:
    newest = migration_files()[-1][0]
    current = await schema_version(store.pool)
    if current < newest:
        raise StartupError(f"database schema is at version {current}, this worker "
                           f"needs {newest}: run `phasegate migrate` first")


def log_fifo_quota(attributes: Mapping[str, str]) -> None:
    """Say once at start which SQS FIFO quota this queue is under: the number that caps the
    fleet's throughput (docs/reference/capacity.md)."""
    quota = fifo_quota(attributes)
    log.info("sqs_quota", mode=quota.mode,
             deduplication_scope=attributes.get("DeduplicationScope", "queue"),
             fifo_throughput_limit=attributes.get("FifoThroughputLimit", "perQueue"),
             calls_per_s_per_action=quota.calls_per_s_per_action,
             messages_per_s_batched=quota.messages_per_s_batched,
             calls_per_s_per_group=quota.calls_per_s_per_group)
    if quota.mode != "high_throughput":
        log.warning("sqs_quota_standard_fifo",
                    hint="set DeduplicationScope=messageGroup and "
                         "FifoThroughputLimit=perMessageGroupId for high-throughput mode")
