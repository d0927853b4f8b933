"""How a worker starts: Postgres and SQS reached with backoff and checked (schema version, FIFO,
encryption); errors that waiting cannot fix end it at once (exit 2)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass

import asyncpg
import structlog

from phasegate.backoff import Backoff
from phasegate.db import pool_from_settings
from phasegate.limits import fifo_quota
from phasegate.migrate import schema_version
from phasegate.queue import Queue, SqsQueue
from phasegate.residency import stores_from_settings
from phasegate.settings import Settings
from phasegate.sql import migration_files
from phasegate.store import Store

__all__ = ["PERMANENT_DB_ERRORS", "Dependencies", "PermanentStartupError", "StartupError",
           "check_schema", "close_pool", "connect_dependencies", "log_fifo_quota", "one_line"]

log = structlog.get_logger("phasegate.worker")

# Startup retries use full jitter (phasegate/backoff.py) with a small cap, so a pod notices a
# recovered dependency within seconds of its readiness probe.
STARTUP_RETRY_BASE_S = 0.25
STARTUP_RETRY_CAP_S = 5.0
# A graceful close resets each released connection with a query; behind a pooler whose server
# is restarting that query waits for a server connection, so the close is bounded and then
# the connections are dropped (the server rolls back whatever they held).
POOL_CLOSE_S = 1.5


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


@dataclass(frozen=True)
class Dependencies:
    """What a worker reaches before its first receive."""

    store: Store
    queue: Queue
    dlq: Queue


async def connect_dependencies(settings: Settings, stack: AsyncExitStack, stop: asyncio.Event,
                               given: tuple[Store | None, Queue | None, Queue | None]
                               ) -> Dependencies | None:
    """Postgres and SQS, checked (schema version, FIFO, encryption), their closing pushed onto
    ``stack``; retried with backoff until the startup timeout; None when ``stop`` is set first.
    What ``given`` holds (store, queue, dlq: a test's or a benchmark's own) is used as is."""
    return await _Connector(settings, stack, stop, given).connect()


class _Connector:
    def __init__(self, settings: Settings, stack: AsyncExitStack, stop: asyncio.Event,
                 given: tuple[Store | None, Queue | None, Queue | None]) -> None:
        self.settings, self.stack, self.stop = settings, stack, stop
        self.store, self.queue, self.dlq = given

    async def connect(self) -> Dependencies | None:
        """Prove Postgres and SQS are reachable before the first receive, with backoff; None
        when stopped first."""
        deadline = time.monotonic() + self.settings.startup_timeout_s
        # Full jitter (phasegate/backoff.py): pods started together by a scale-out do not probe
        # a recovering database in lockstep.
        backoff = Backoff(base=STARTUP_RETRY_BASE_S, cap=STARTUP_RETRY_CAP_S)
        while not self.stop.is_set():
            waiting_for = []
            if self.store is None:
                try:
                    pool = await pool_from_settings(self.settings)
                    self.stack.push_async_callback(close_pool, pool)
                    # One RegionalStore, or a router over PHASEGATE_STORES (governance docs).
                    self.store = await stores_from_settings(self.settings, pool, self.stack)
                except PERMANENT_DB_ERRORS as exc:  # retrying cannot fix a password
                    raise PermanentStartupError(
                        f"PostgreSQL refused PHASEGATE_DATABASE_URL: {one_line(exc)}") from None
                except Exception as exc:
                    waiting_for.append(f"postgres ({type(exc).__name__}: {exc})"[:200])
            if self.queue is None:
                sqs = SqsQueue(self.settings.queue_url or "",
                               endpoint_url=self.settings.sqs_endpoint_url,
                               region=self.settings.aws_region)
                await sqs.open()
                self.stack.push_async_callback(sqs.close)
                self.queue, self.dlq = sqs, sqs.sibling(self.settings.dlq_url or "")
            if not waiting_for:
                # The DLQ is not probed: the worker only sends to it, and the documented IAM
                # policy grants exactly sqs:SendMessage there (README, "IAM roles").
                try:
                    assert self.queue is not None
                    attributes = await self.queue.fifo_attributes()
                except Exception as exc:
                    waiting_for.append(f"sqs ({type(exc).__name__}: {exc})"[:200])
                else:
                    if attributes.get("FifoQueue") != "true":
                        raise PermanentStartupError(
                            "PHASEGATE_QUEUE_URL is not a FIFO queue (FifoQueue is not true): "
                            "phasegate needs per-workflow ordering; create a .fifo queue")
                    await self.check_encryption()
                    log_fifo_quota(attributes)
            if not waiting_for:
                assert self.store is not None
                try:
                    await check_schema(self.store)
                    assert self.queue is not None and self.dlq is not None
                    return Dependencies(self.store, self.queue, self.dlq)
                except StartupError:
                    raise
                except Exception as exc:
                    # Behind a pooler the pool opens without any server connection, so the
                    # first query is where a restarting database shows (found by the chaos
                    # run through PgBouncer: a worker exited 1 here).
                    waiting_for.append(f"postgres ({type(exc).__name__}: {exc})"[:200])
            if time.monotonic() > deadline:
                raise StartupError(f"gave up after {self.settings.startup_timeout_s:g}s "
                                   f"waiting for {', '.join(waiting_for)}")
            delay = backoff.next()
            log.warning("waiting_for_dependencies", waiting_for=waiting_for,
                        retry_in_s=round(delay, 3))
            with suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay)
        return None

    async def check_encryption(self) -> None:
        """Phase messages carry workflow state: a queue without SSE is refused when
        PHASEGATE_REQUIRE_QUEUE_ENCRYPTION is set, and reported otherwise."""
        assert self.queue is not None
        try:
            encryption = await self.queue.encryption()
        except Exception as exc:  # the FIFO check just answered: not worth waiting for
            if self.settings.require_queue_encryption:
                raise StartupError(f"cannot read the queue's encryption: {one_line(exc)}") \
                    from None
            log.warning("queue_encryption_unknown", error=type(exc).__name__)
            return
        if encryption is not None:
            return
        if self.settings.require_queue_encryption:
            raise PermanentStartupError(
                "PHASEGATE_QUEUE_URL is not encrypted at rest (neither SqsManagedSseEnabled nor "
                "a KmsMasterKeyId): create it with SSE, or unset "
                "PHASEGATE_REQUIRE_QUEUE_ENCRYPTION")
        log.warning("queue_not_encrypted", queue=self.settings.queue_url)


async def close_pool(pool: asyncpg.Pool) -> None:
    """Close gracefully within POOL_CLOSE_S, else drop the connections."""
    try:
        await asyncio.wait_for(pool.close(), POOL_CLOSE_S)
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        log.warning("pool_close_forced", error=type(exc).__name__)
        pool.terminate()
