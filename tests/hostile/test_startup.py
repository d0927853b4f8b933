"""Startup refuses what cannot work: one line naming the problem and exit 2, at once, never
after waiting out PHASEGATE_STARTUP_TIMEOUT_S (set to 10 minutes here: a test that waited
it out would hit its own subprocess timeout instead)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

import aioboto3
import pytest

from tests.conftest import with_database
from tests.helpers import fetch, make_settings, settings_env
from tests.integration.test_cli_errors import phasegate

PATIENT = {"startup_timeout_s": 600.0}


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def run_worker(env: dict[str, str]) -> tuple[int, str]:
    done = phasegate("worker", env={**env, "PHASEGATE_WORKFLOW_MODULES": "tests.workflows",
                                    "PHASEGATE_LOG_FORMAT": "json"}, timeout=120)
    assert "Traceback" not in done.stderr
    return done.returncode, last_line(done.stderr)


async def standard_queue(endpoint: str, name: str) -> str:
    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=endpoint, region_name="us-east-1") as client:
        return str((await client.create_queue(QueueName=name))["QueueUrl"])


async def test_a_standard_queue_is_refused(database_url, queue_pair, sqs_endpoint):
    url = await standard_queue(sqs_endpoint, f"standard-{id(queue_pair):x}")
    settings = make_settings(database_url, (url, queue_pair[1]), sqs_endpoint, **PATIENT)
    code, line = run_worker(settings_env(settings))
    assert code == 2
    assert line.startswith("phasegate: PHASEGATE_QUEUE_URL is not a FIFO queue")


def with_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def refused_dsns(pg_server_dsn):
    return {
        "missing database": (with_database(pg_server_dsn, "phasegate_no_such_db"),
                             "InvalidCatalogNameError"),
        "unknown role": (with_user(pg_server_dsn, "phasegate_no_such_role"),
                         "InvalidAuthorizationSpecificationError"),
    }


async def test_permanent_postgres_errors_end_the_worker_at_once(refused_dsns, queue_pair,
                                                                sqs_endpoint):
    for dsn, error in refused_dsns.values():
        settings = make_settings(dsn, queue_pair, sqs_endpoint, **PATIENT)
        code, line = run_worker(settings_env(settings))
        assert code == 2
        assert line.startswith(f"phasegate: PostgreSQL refused PHASEGATE_DATABASE_URL: {error}")


async def test_migrate_errors_are_one_line(refused_dsns, empty_database_url):
    for dsn, error in refused_dsns.values():
        done = phasegate("migrate", env={"PHASEGATE_DATABASE_URL": dsn})
        assert done.returncode == 2
        assert done.stderr.startswith(f"phasegate: PostgreSQL refused PHASEGATE_DATABASE_URL: "
                                      f"{error}")
        assert len(done.stderr.strip().splitlines()) == 1
    # A database in the way of the first migration: the SQL error, one line, nothing applied.
    await fetch(empty_database_url, "CREATE TABLE workflow_runs (x integer)")
    done = await asyncio.to_thread(phasegate, "migrate",
                                   env={"PHASEGATE_DATABASE_URL": empty_database_url})
    assert done.returncode == 1
    assert done.stderr.startswith("phasegate: migrate failed at PHASEGATE_DATABASE_URL: ")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


async def unencrypted_fifo_queue(endpoint: str, name: str) -> str:
    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=endpoint, region_name="us-east-1") as client:
        return str((await client.create_queue(QueueName=f"{name}.fifo", Attributes={
            "FifoQueue": "true", "SqsManagedSseEnabled": "false"}))["QueueUrl"])


async def test_an_unencrypted_queue_is_refused_when_encryption_is_required(
        database_url, queue_pair, sqs_endpoint):
    from phasegate.queue import SqsQueue

    url = await unencrypted_fifo_queue(sqs_endpoint, f"plain-{id(queue_pair):x}")
    for queue_url, expected in ((url, None), (queue_pair[0], "SSE-SQS")):
        async with SqsQueue(queue_url, endpoint_url=sqs_endpoint, region="us-east-1") as queue:
            assert await queue.encryption() == expected
    settings = make_settings(database_url, (url, queue_pair[1]), sqs_endpoint,
                             require_queue_encryption=True, **PATIENT)
    code, line = run_worker(settings_env(settings))
    assert code == 2
    assert line.startswith("phasegate: PHASEGATE_QUEUE_URL is not encrypted at rest")
