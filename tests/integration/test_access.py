"""Access policy and the Postgres roles of migration 0005, proven by connecting as each role."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from phasegate import Workflow
from phasegate.access import access_log, parse_policy
from phasegate.migrate import migrate
from phasegate.orchestrator.api import Services, create_app
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.fleet import FleetView
from phasegate.orchestrator.starter import start_workflow
from phasegate.residency import RegionalStore
from phasegate.sql import migration_files
from phasegate.store import create_pool
from phasegate.workflow import Registry
from tests.helpers import all_done, make_settings, queue_for, running_worker, wait_for

guarded = Workflow("guarded")


@guarded.phase("intake")
async def intake(ctx, state):
    return {**state, "ssn": "000-00-0000"}


@guarded.phase("score")
async def score(ctx, state):
    return {**state, "score": 7}


REGISTRY = Registry([guarded])
POLICY = parse_policy('{"guarded.score": ["analyst", "ops"], "guarded.*": ["ops"]}')


def as_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@asynccontextmanager
async def login_user(dsn: str, group: str) -> AsyncIterator[str]:
    """A LOGIN user granted one of phasegate's NOLOGIN group roles; its DSN."""
    user = f"pgt_{group.removeprefix('phasegate_')}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE ROLE "{user}" LOGIN IN ROLE {group}')
        yield as_user(dsn, user)
    finally:
        await admin.execute(f'DROP ROLE IF EXISTS "{user}"')
        await admin.close()


async def finished_run(settings) -> str:
    pool = await create_pool(settings.database_url, min_size=1, max_size=1)
    try:
        async with queue_for(settings) as queue:
            started = await start_workflow(RegionalStore(pool), queue, workflow=guarded,
                                           input={"name": "n"})
    finally:
        await pool.close()
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [started.workflow_id]),
                       what="run done")
    return started.workflow_id


async def denied(connection: asyncpg.Connection, sql: str, *args: object) -> bool:
    try:
        await connection.execute(sql, *args)
    except asyncpg.InsufficientPrivilegeError:
        return True
    return False


@pytest.fixture
def settings(database_url, queue_pair, sqs_endpoint):
    return make_settings(database_url, queue_pair, sqs_endpoint)


async def test_the_engine_runs_as_the_worker_role_which_has_no_ddl_and_no_access_log(
        settings, database_url):
    async with login_user(database_url, "phasegate_worker") as worker_dsn:
        # The whole engine (claim, steps, commit, outbox, mark sent) with only its DML.
        wid = await finished_run(settings.model_copy(update={"database_url": worker_dsn}))
        connection = await asyncpg.connect(worker_dsn)
        try:
            assert await connection.fetchval(
                "SELECT count(*) FROM checkpoints WHERE workflow_id = $1", wid) == 2
            assert await denied(connection, "CREATE TABLE sneaky (x int)")
            assert await denied(connection, "ALTER TABLE workflow_runs ADD COLUMN y int")
            assert await denied(connection, "DROP TABLE outbox")
            assert await denied(connection, "DELETE FROM workflow_runs")
            assert await denied(connection, "SELECT * FROM access_log")
            assert await denied(connection, "UPDATE checkpoints SET phase = 'x'")
        finally:
            await connection.close()


async def test_the_reader_sees_run_metadata_but_never_state(settings, database_url):
    wid = await finished_run(settings)
    async with login_user(database_url, "phasegate_reader") as reader_dsn:
        connection = await asyncpg.connect(reader_dsn)
        try:
            row = await connection.fetchrow(
                "SELECT workflow_id, status, classification FROM workflow_runs "
                "WHERE workflow_id = $1", wid)
            assert row["status"] == "completed" and row["classification"] == "internal"
            assert await connection.fetchval(
                "SELECT count(*) FROM checkpoints WHERE workflow_id = $1", wid) == 2
            assert await denied(connection, "SELECT state FROM checkpoints")
            assert await denied(connection, "SELECT input FROM workflow_runs")
            assert await denied(connection, "SELECT * FROM workflow_runs")
            assert await denied(connection, "SELECT output FROM step_records")
            assert await denied(connection, "SELECT * FROM access_log")
            assert await denied(connection, "UPDATE workflow_runs SET status = 'failed'")
        finally:
            await connection.close()


async def test_policy_enforced_on_reads_every_read_and_denial_logged_auditor_reads_the_log(
        settings, database_url):
    wid = await finished_run(settings)
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        control = Control(pool, None, REGISTRY, actor="api", read_policy=POLICY)
        app = create_app(Services(control=control, queue=None,
                                  fleet=FleetView(None, reason="none")))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            url = f"/v1/workflows/{wid}/checkpoints?include=state"
            analyst = (await client.get(url, headers={"X-Phasegate-Role": "analyst"})).json()
            ops = (await client.get(url, headers={"X-Phasegate-Role": "ops"})).json()
            anonymous = (await client.get(url)).json()
        by_phase = {c["phase"]: c for c in analyst["checkpoints"]}
        assert by_phase["intake"]["access"] == "denied" and by_phase["intake"]["state"] is None
        assert by_phase["score"]["access"] == "read" and by_phase["score"]["state"]["score"] == 7
        assert all(c["access"] == "read" and c["state"] for c in ops["checkpoints"])
        assert all(c["state"] is None for c in anonymous["checkpoints"])
        log = await access_log(pool, wid)
        assert [(r["role"], r["phase"], r["decision"]) for r in log] == [
            ("analyst", "intake", "denied"), ("analyst", "score", "read"),
            ("ops", "intake", "read"), ("ops", "score", "read"),
            (None, "intake", "denied"), (None, "score", "denied")]
        assert all(r["actor"] == "api" for r in log)
    finally:
        await pool.close()
    async with login_user(database_url, "phasegate_auditor") as auditor_dsn:
        connection = await asyncpg.connect(auditor_dsn)
        try:
            assert await connection.fetchval(
                "SELECT count(*) FROM access_log WHERE workflow_id = $1", wid) == 6
            assert await denied(connection, "SELECT workflow_id FROM workflow_runs")
            assert await denied(connection, "SELECT state FROM checkpoints")
            assert await denied(connection, "DELETE FROM access_log")
        finally:
            await connection.close()


async def test_the_access_log_is_append_only_even_for_its_owner(database_url):
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "INSERT INTO access_log (workflow_id, decision, resource) "
            "VALUES ('w', 'read', 'checkpoint_state')")
        for sql in ("UPDATE access_log SET decision = 'denied'", "DELETE FROM access_log",
                    "TRUNCATE access_log"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
                await connection.execute(sql)
        assert await connection.fetchval("SELECT count(*) FROM access_log") == 1
        # A run's residency is fixed once written.
        await connection.execute("INSERT INTO workflow_runs (workflow_id, workflow, "
                                 "schema_version) VALUES ('r', 'w', 1)")
        with pytest.raises(asyncpg.IntegrityConstraintViolationError, match="fixed at start"):
            await connection.execute("UPDATE workflow_runs SET region = 'eu'")
    finally:
        await connection.close()


async def test_migration_0005_is_idempotent_and_roles_are_nologin(database_url):
    await migrate(database_url)  # nothing to apply; the roles exist already
    connection = await asyncpg.connect(database_url)
    try:
        governance = next(text for version, _, text in migration_files() if version == 5)
        await connection.execute(governance)  # applied twice: still fine
        rows = await connection.fetch(
            "SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'phasegate\\_%'")
        roles = {r["rolname"]: r["rolcanlogin"] for r in rows}
        # Roles are cluster-wide: later migrations (and other databases on the same server) may
        # add more phasegate_ group roles; these three must exist and none may log in.
        assert {"phasegate_worker", "phasegate_reader", "phasegate_auditor"} <= roles.keys()
        assert not any(roles.values()), roles
    finally:
        await connection.close()
