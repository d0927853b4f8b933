"""Real servers for the whole suite: PostgreSQL (a template database cloned per test) and an
SQS-compatible server over HTTP (a fresh FIFO queue pair per test).

PostgreSQL: $PHASEGATE_TEST_DATABASE_URL, else 127.0.0.1:5432 if it answers, else a
throwaway cluster started here. SQS: $PHASEGATE_TEST_SQS_ENDPOINT_URL (e.g. LocalStack), else
moto server in a thread of this process.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from bench.pgbouncer import PgBouncer, current_root
from phasegate.migrate import migrate
from phasegate.orchestrator.embedded import EmbeddedPostgres, EmbeddedSqs, local_aws_env
from phasegate.settings import Settings
from tests.helpers import NAMED_STATEMENT_URLS

os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})


# Tables only test databases have: what phases did (across processes) and gates tests open.
TEST_TABLES = """
CREATE TABLE test_invocations (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id text NOT NULL, seq integer NOT NULL, phase text NOT NULL,
    attempt integer NOT NULL, worker_id text, note text, at timestamptz DEFAULT now());
CREATE TABLE test_gates (name text PRIMARY KEY);
"""


def with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


async def _reachable(dsn: str) -> bool:
    try:
        connection = await asyncpg.connect(dsn, timeout=3)
    except Exception:
        return False
    await connection.close()
    return True


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    explicit = os.environ.get("PHASEGATE_TEST_DATABASE_URL")
    if explicit:
        yield explicit
        return
    local = "postgresql://postgres@127.0.0.1:5432/postgres"
    if asyncio.run(_reachable(local)):
        yield local
        return
    with EmbeddedPostgres() as server:
        yield server.dsn


@pytest.fixture(scope="session")
def template_db(pg_server_dsn: str) -> Iterator[str]:
    name = f"phasegate_tpl_{uuid.uuid4().hex[:10]}"

    async def create() -> None:
        admin = await asyncpg.connect(pg_server_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        await migrate(with_database(pg_server_dsn, name))
        connection = await asyncpg.connect(with_database(pg_server_dsn, name))
        try:
            await connection.execute(TEST_TABLES)
        finally:
            await connection.close()

    asyncio.run(create())
    yield name
    asyncio.run(_drop(pg_server_dsn, name))


async def _drop(server_dsn: str, name: str) -> None:
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@contextmanager
def throwaway_database(server_dsn: str, prefix: str, template: str | None = None
                       ) -> Iterator[str]:
    """CREATE DATABASE (optionally from a template) for one test; DROP it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    clause = f' TEMPLATE "{template}"' if template else ""

    async def create() -> None:
        admin = await asyncpg.connect(server_dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"{clause}')
        finally:
            await admin.close()

    asyncio.run(create())
    try:
        yield with_database(server_dsn, name)
    finally:
        asyncio.run(_drop(server_dsn, name))


# How a test's processes reach Postgres: directly, or through PgBouncer in transaction mode
# with 6 server connections (bench/pgbouncer.py). The modules that prove the engine's
# guarantees (SIGKILL, SIGTERM -> exit 0, duplicates and the relay, poison) run both ways;
# everything else runs direct, to keep the suite's time.
# "pgbouncer-named": the same PgBouncer with PHASEGATE_DATABASE_POOLER=pgbouncer (statements
# named by their text, phasegate/named_statements.py) for the pools and workers of the test.
# "pgbouncer-current": that mode through a current PgBouncer (1.24, ``pgbouncer_current``), which
# tracks each client's named statements itself (and closes a client that binds a name it never
# parsed). The unnamed default mode sends nothing such a PgBouncer treats differently.
ROUTES = ("direct", "pgbouncer", "pgbouncer-named", "pgbouncer-current")
POOLED_MODULES = frozenset({
    "tests.integration.test_engine_e2e",
    "tests.integration.test_crashes",
    "tests.integration.test_duplicates_and_relay",
    "tests.integration.test_poison_and_failures",
    "tests.integration.test_group_commit",
    "tests.integration.test_outbox_leases",
})


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db_route" in metafunc.fixturenames and metafunc.module.__name__ in POOLED_MODULES:
        metafunc.parametrize("db_route", ROUTES, indirect=True)


@pytest.fixture
def db_route(request: pytest.FixtureRequest) -> str:
    route: str = getattr(request, "param", "direct")
    return route


@pytest.fixture(scope="session")
def pgbouncer(pg_server_dsn: str) -> Iterator[PgBouncer]:
    """Debian's PgBouncer 1.18, transaction mode, 6 server connections per database."""
    with PgBouncer.in_front_of(pg_server_dsn) as bouncer:
        yield bouncer


@pytest.fixture(scope="session")
def pgbouncer_current(pg_server_dsn: str) -> Iterator[PgBouncer]:
    """A current PgBouncer (1.24, scripts/pgbouncer-current.sh, built on first use) as
    ``pgbouncer`` runs it, with ``max_prepared_statements`` at its default (200): it tracks
    each client's named statements itself."""
    with PgBouncer.in_front_of(pg_server_dsn, root=current_root()) as bouncer:
        assert bouncer.tracks_prepared_statements, bouncer.version()
        yield bouncer


@pytest.fixture(scope="session")
def pgbouncer_current_untracked(pg_server_dsn: str) -> Iterator[PgBouncer]:
    """The same PgBouncer 1.24 with ``max_prepared_statements = 0``, the default of 1.21 to
    1.23: it tracks no named statement and passes each Parse and Bind to whichever server
    connection the transaction has, as 1.18 does."""
    with PgBouncer.in_front_of(pg_server_dsn, root=current_root(),
                               extra={"max_prepared_statements": "0"}) as bouncer:
        assert not bouncer.tracks_prepared_statements, bouncer.version()
        yield bouncer


# The PgBouncer fixture each route through a pooler takes.
BOUNCERS = {"pgbouncer-current": "pgbouncer_current",
            "pgbouncer-current-untracked": "pgbouncer_current_untracked"}


@pytest.fixture
def database_url(pg_server_dsn: str, template_db: str, db_route: str,
                 request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, migrated database for this test (a clone of the template), reached the way
    ``db_route`` says (created and dropped directly either way)."""
    with throwaway_database(pg_server_dsn, "phasegate_t", template_db) as url:
        if db_route.startswith("pgbouncer"):
            bouncer: PgBouncer = request.getfixturevalue(BOUNCERS.get(db_route, "pgbouncer"))
            routed = bouncer.route(url)
            if db_route in ("pgbouncer-named", "pgbouncer-current",
                            "pgbouncer-current-untracked"):
                NAMED_STATEMENT_URLS.add(routed)
            try:
                yield routed
            finally:
                NAMED_STATEMENT_URLS.discard(routed)
        else:
            yield url


@pytest.fixture
def empty_database_url(pg_server_dsn: str) -> Iterator[str]:
    """A database with no phasegate schema at all."""
    with throwaway_database(pg_server_dsn, "phasegate_e") as url:
        yield url


@pytest.fixture(scope="session")
def sqs_endpoint() -> Iterator[str]:
    explicit = os.environ.get("PHASEGATE_TEST_SQS_ENDPOINT_URL")
    if explicit:
        yield explicit
        return
    with EmbeddedSqs() as server:
        yield server.endpoint_url


@pytest.fixture
def queue_pair(sqs_endpoint: str) -> tuple[str, str]:
    """A fresh FIFO queue and DLQ on the SQS server (names unique per test)."""
    from tests.helpers import create_queues

    return asyncio.run(create_queues(sqs_endpoint, f"t{uuid.uuid4().hex[:16]}"))


@pytest.fixture
def settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> Settings:
    """Fast-lease settings for this test's database and queues; the test workflows record
    their invocations in the same database. Modules that need other values override it."""
    from tests import workflows
    from tests.helpers import make_settings

    workflows.LEDGER_DSN = database_url
    return make_settings(database_url, queue_pair, sqs_endpoint)
