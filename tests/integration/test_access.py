"""Access policy and the Postgres roles of migrations 0005 and 0007, proven by connecting as
each role."""

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
from phasegate.orchestrator.auth import TokenFile
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.fleet import FleetView
from phasegate.orchestrator.starter import start_workflow
from phasegate.residency import RegionalStore
from phasegate.sql import migration_files
from phasegate.store import Store, create_pool
from phasegate.workflow import Registry
from tests.helpers import (
    all_done,
    bearer,
    fetchval,
    make_settings,
    queue_for,
    running_worker,
    wait_for,
    write_tokens,
)

guarded = Workflow("guarded")


@guarded.phase("intake")
async def intake(ctx, state):
    return {**state, "ssn": "000-00-0000"}


@guarded.phase("score")
async def score(ctx, state):
    return {**state, "score": 7}


# Started by the API, which takes its slot in the start's statement (migration 0034).
keyed_guarded = Workflow("keyed-guarded", concurrency_key=lambda input: "one",
                         max_concurrency=1)


@keyed_guarded.phase("only")
async def keyed_only(ctx, state):
    return state


REGISTRY = Registry([guarded, keyed_guarded])
GROUP_ROLES = ("phasegate_worker", "phasegate_reader", "phasegate_auditor",
               "phasegate_orchestrator")
POLICY_TEXT = '{"guarded.score": ["analyst", "ops"], "guarded.*": ["ops"]}'
POLICY = parse_policy(POLICY_TEXT)


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


@asynccontextmanager
async def store_as(dsn: str, group: str) -> AsyncIterator[Store]:
    """A store over one connection of a LOGIN user in ``group`` (``login_user``)."""
    async with login_user(dsn, group) as user_dsn:
        pool = await create_pool(user_dsn, min_size=1, max_size=1)
        try:
            yield Store(pool)
        finally:
            await pool.close()


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
            # Its presence row (0015) was written with these grants; it marks, never deletes.
            assert await connection.fetchval("SELECT count(*) FROM worker_presence") == 1
            assert await denied(connection, "DELETE FROM worker_presence")
            # A failed attempt is counted and kept in one statement with the same grants.
            await connection.execute(
                "INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, "
                "current_phase, schema_version) VALUES ('r-fail', 'guarded', 'running', 0, "
                "'check', 1)")
            store = Store(await create_pool(worker_dsn, min_size=1, max_size=1))
            try:
                assert await store.record_failure("r-fail", 0, "RuntimeError", 5,
                                                  phase="check", worker_id="w") == (1, "running")
            finally:
                await store.pool.close()
            assert await denied(connection, "SELECT * FROM phase_attempts")  # insert only
            assert await fetchval(database_url, "SELECT outcome FROM phase_attempts WHERE "
                                  "workflow_id = 'r-fail' AND attempt = 1") == "retry"
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
        settings, database_url, tmp_path):
    wid = await finished_run(settings)
    tokens = write_tokens(tmp_path / "tokens", {"ana": "viewer,analyst", "olga": "viewer,ops",
                                                "vic": "viewer"})
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        control = Control(pool, None, REGISTRY, actor="api", read_policy=POLICY)
        app = create_app(Services(control=control, queue=None,
                                  fleet=FleetView(None, reason="none"),
                                  auth=TokenFile(tmp_path / "tokens")))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            url = f"/v1/workflows/{wid}/checkpoints?include=state"
            analyst = (await client.get(url, headers=bearer(tokens["ana"]))).json()
            ops = (await client.get(url, headers=bearer(tokens["olga"]))).json()
            # The role header is not trusted: a viewer claiming "ops" is still a viewer.
            claimed = (await client.get(url, headers={**bearer(tokens["vic"]),
                                                      "X-Phasegate-Role": "ops"})).json()
            stranger = await client.get(url, headers={"X-Phasegate-Role": "ops"})
        assert stranger.status_code == 401
        by_phase = {c["phase"]: c for c in analyst["checkpoints"]}
        assert by_phase["intake"]["access"] == "denied" and by_phase["intake"]["state"] is None
        assert by_phase["score"]["access"] == "read" and by_phase["score"]["state"]["score"] == 7
        assert all(c["access"] == "read" and c["state"] for c in ops["checkpoints"])
        assert all(c["state"] is None for c in claimed["checkpoints"])
        log = await access_log(pool, wid)
        assert [(r["actor"], r["role"], r["phase"], r["decision"]) for r in log] == [
            ("ana", "analyst,viewer", "intake", "denied"),
            ("ana", "analyst,viewer", "score", "read"),
            ("olga", "ops,viewer", "intake", "read"), ("olga", "ops,viewer", "score", "read"),
            ("vic", "viewer", "intake", "denied"), ("vic", "viewer", "score", "denied")]
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


async def test_role_migrations_are_idempotent_and_roles_are_nologin(database_url):
    await migrate(database_url)  # nothing to apply; the roles exist already
    connection = await asyncpg.connect(database_url)
    try:
        for role_migration in (5, 7):
            text = next(text for version, _, text in migration_files()
                        if version == role_migration)
            await connection.execute(text)  # applied twice: still fine
        # Roles are cluster-wide: other databases on this server may hold more roles with
        # the prefix; phasegate's own are exactly these, all NOLOGIN.
        rows = await connection.fetch(
            "SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname = ANY($1::text[])",
            list(GROUP_ROLES))
        assert {r["rolname"]: r["rolcanlogin"] for r in rows} == dict.fromkeys(
            GROUP_ROLES, False)
    finally:
        await connection.close()


async def test_the_orchestrator_runs_as_its_role_which_cannot_alter_schema_or_delete(
        settings, database_url, tmp_path):
    """API start/approve-path/cancel, state reads (logged), relay and exporter as
    phasegate_orchestrator (migration 0007); everything outside its grants is refused."""
    from phasegate.orchestrator.server import OrchestratorOptions, running_orchestrator

    done = await finished_run(settings)
    tokens = write_tokens(tmp_path / "tokens", {"ops-bot": "operator,ops"})
    async with login_user(database_url, "phasegate_orchestrator") as orch_dsn:
        as_orchestrator = settings.model_copy(update={
            "database_url": orch_dsn, "api_auth": "tokens",
            "api_tokens_file": str(tmp_path / "tokens"), "read_policy": POLICY_TEXT})
        options = OrchestratorOptions(host="127.0.0.1", port=0, exporter_interval_s=0.1)
        async with running_orchestrator(as_orchestrator, REGISTRY, options) as orch, \
                httpx.AsyncClient(base_url=orch.url, headers=bearer(tokens["ops-bot"])) as api:
            started = await api.post("/v1/workflows", json={"workflow": "guarded", "id": "o-1",
                                                            "input": {"name": "o"}})
            assert started.status_code == 201, started.text
            cancelled = await api.post("/v1/workflows/o-1/cancel", json={"reason": "test"})
            assert cancelled.status_code == 200, cancelled.text
            # A keyed start takes its slot as the orchestrator's role: admitted, then queued.
            keyed = [await api.post("/v1/workflows", json={
                "workflow": "keyed-guarded", "id": f"k-{i}", "input": {}}) for i in range(2)]
            assert [(r.status_code, r.json()["status"]) for r in keyed] == [
                (201, "pending"), (201, "queued")], [r.text for r in keyed]
            page = await api.get(f"/v1/workflows/{done}/checkpoints?include=state")
            assert page.status_code == 200
            assert all(c["access"] == "read" for c in page.json()["checkpoints"])
            assert (await api.get("/v1/summary")).status_code == 200
            assert (await api.get("/readyz")).status_code == 200
        connection = await asyncpg.connect(orch_dsn)
        try:
            assert await connection.fetchval(
                "SELECT actor FROM control_actions WHERE workflow_id = 'o-1'") == "ops-bot"
            assert await denied(connection, "CREATE TABLE sneaky (x int)")
            assert await denied(connection, "ALTER TABLE workflow_runs ADD COLUMN y int")
            assert await denied(connection, "DROP TABLE outbox")
            assert await denied(connection, "DELETE FROM workflow_runs")
            assert await denied(connection, "DELETE FROM checkpoints")
            assert await denied(connection, "TRUNCATE outbox")
            assert await denied(connection, "UPDATE checkpoints SET phase = 'x'")
            assert await denied(connection, "SELECT * FROM access_log")
            assert await denied(connection, "SELECT * FROM step_records")
        finally:
            await connection.close()
    admin = await asyncpg.connect(database_url)
    try:
        logged = await admin.fetch("SELECT actor, role FROM access_log WHERE workflow_id = $1",
                                   done)
        assert {(r["actor"], r["role"]) for r in logged} == {("ops-bot", "operator,ops")}
    finally:
        await admin.close()
