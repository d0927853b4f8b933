"""The API refuses strangers: every /v1 route against the real ``phasegate orchestrator``
process, with a tokens file, checking status codes, the database and the access log."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from phasegate.orchestrator.api import Services, create_app
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.embedded import free_port
from phasegate.orchestrator.fleet import FleetView
from phasegate.settings import Settings
from phasegate.workflow import Registry
from tests.helpers import (
    ROOT,
    bearer,
    fetchval,
    make_settings,
    settings_env,
    wait_for,
    write_tokens,
)

ROLES = {"val": "viewer", "otto": "operator", "ada": "admin"}
# Every /v1 route, the role it needs, and a body where it takes one.
ROUTES: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("GET", "/v1/workflows", "viewer", None),
    ("GET", "/v1/workflows/r-1", "viewer", None),
    ("GET", "/v1/workflows/r-1/checkpoints", "viewer", None),
    ("GET", "/v1/workflows/r-1/actions", "viewer", None),
    ("GET", "/v1/workflows/r-1/branches", "viewer", None),
    ("GET", "/v1/stalls", "viewer", None),
    ("GET", "/v1/summary", "viewer", None),
    ("GET", "/v1/fleet", "viewer", None),
    ("POST", "/v1/workflows", "operator", {"workflow": "chain", "id": "r-2"}),
    ("POST", "/v1/workflows/r-1/cancel", "operator", {"reason": "x"}),
    ("POST", "/v1/workflows/r-1/retry", "operator", None),
    ("POST", "/v1/workflows/r-1/restart", "operator", None),
    ("POST", "/v1/workflows/r-1/approve", "operator", None),
    ("POST", "/v1/workflows/r-1/reject", "operator", None),
    ("POST", "/v1/workflows/r-1/merge", "admin", {"branch": "b"}),
]
LEVEL = {"viewer": 1, "operator": 2, "admin": 3}


@pytest.fixture
def settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> Settings:
    return make_settings(database_url, queue_pair, sqs_endpoint)


def spawn(port: int, log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "phasegate.cli", "orchestrator", "--port", str(port)],
            env={**os.environ, **env, "PYTHONPATH": str(ROOT), "PHASEGATE_LOG_FORMAT": "json",
                 "PHASEGATE_WORKFLOW_MODULES": "tests.workflows"},
            cwd=ROOT, stdout=log, stderr=log)


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "phasegate.cli", *args], env=env,
                          capture_output=True, timeout=60, cwd=ROOT)


@asynccontextmanager
async def orchestrator_process(settings: Settings, tokens_file: Path,
                               **env: str) -> AsyncIterator[tuple[str, Path]]:
    """The orchestrator as a process; yields its URL and the file its log goes to."""
    port = free_port()
    log_path = tokens_file.with_name("orchestrator.log")
    process = spawn(port, log_path, {
        **settings_env(settings), "PHASEGATE_API_AUTH": "tokens",
        "PHASEGATE_API_TOKENS_FILE": str(tokens_file), **env})
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5) as client:
            async def ready() -> bool:
                if process.poll() is not None:
                    raise AssertionError(log_path.read_text()[-2000:])
                try:
                    return (await client.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await wait_for(ready, timeout=60, what="orchestrator ready")
        yield url, log_path
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


async def counts(dsn: str) -> tuple[int, int, int, int]:
    connection = await asyncpg.connect(dsn)
    try:
        row = await connection.fetchrow(
            "SELECT (SELECT count(*) FROM workflow_runs), (SELECT count(*) FROM outbox), "
            "(SELECT count(*) FROM control_actions), (SELECT count(*) FROM checkpoints)")
        return tuple(row)  # type: ignore[return-value]
    finally:
        await connection.close()


async def test_every_route_needs_its_role_and_strangers_change_nothing(
        settings: Settings, tmp_path: Path) -> None:
    dsn = settings.database_url or ""
    tokens = write_tokens(tmp_path / "tokens", ROLES)
    async with orchestrator_process(settings, tmp_path / "tokens") as (url, log_path):
        async with httpx.AsyncClient(base_url=url, timeout=10) as api:
            # Strangers first: no token, a wrong token, a malformed header, a claimed role.
            for method, path, _, body in ROUTES:
                for headers in ({}, bearer("pgt_not-a-real-token"), {"Authorization": "Basic x"},
                                {"X-Phasegate-Role": "admin"}):
                    response = await api.request(method, path, json=body, headers=headers)
                    assert response.status_code == 401, (method, path, headers)
                    assert response.headers["www-authenticate"].startswith("Bearer")
            assert (await api.get("/v1/no-such-thing")).status_code == 401
            assert await counts(dsn) == (0, 0, 0, 0)  # nothing a stranger sent was stored

            start = await api.post("/v1/workflows", headers=bearer(tokens["otto"]),
                                   json={"workflow": "chain", "id": "r-1", "input": {"n": 1}})
            assert start.status_code == 201, start.text
            before = await counts(dsn)
            # Too weak a role: 403, whatever role header comes with it; nothing changes.
            for method, path, needed, body in ROUTES:
                for name, role in ROLES.items():
                    headers = {**bearer(tokens[name]), "X-Phasegate-Role": "admin"}
                    response = await api.request(method, path, json=body, headers=headers)
                    if LEVEL[role] < LEVEL[needed]:
                        assert response.status_code == 403, (method, path, name)
                        assert needed in response.json()["detail"]
                    else:
                        assert response.status_code not in (401, 403), (method, path, name)
                    assert response.status_code < 500, (method, path, name, response.text)
            after = await counts(dsn)
            assert after[0] == before[0] + 1  # the operator's start of r-2, nobody else's
            cancel = await api.post("/v1/workflows/r-2/cancel", headers=bearer(tokens["ada"]))
            assert cancel.status_code == 200

            actors = await fetchval(dsn, "SELECT array_agg(DISTINCT actor) FROM control_actions")
            assert sorted(actors) == ["ada", "otto"]  # the token NAMEs, never "api"
            for open_path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
                assert (await api.get(open_path)).status_code == 200

        # The CLI sends PHASEGATE_API_TOKEN.
        env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(ROOT),
               "PHASEGATE_API_URL": url}
        ok = await asyncio.to_thread(run, ["status"],
                                     {**env, "PHASEGATE_API_TOKEN": tokens["val"]})
        refused = await asyncio.to_thread(run, ["status"], env)
        assert ok.returncode == 0, ok.stderr.decode()
        assert refused.returncode == 2 and b"PHASEGATE_API_TOKEN" in refused.stderr
    stderr = log_path.read_text()
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    requests = [line for line in lines if line.get("event") == "api_request"]
    assert {(r["status"], r["caller"]) for r in requests} >= {
        (401, None), (403, "val"), (201, "otto"), (200, "ada")}
    assert not any(token in stderr for token in tokens.values())


async def test_input_limits_answer_4xx_and_store_nothing(settings: Settings,
                                                         tmp_path: Path) -> None:
    dsn = settings.database_url or ""
    tokens = write_tokens(tmp_path / "tokens", {"otto": "operator"})
    async with orchestrator_process(settings, tmp_path / "tokens",
                                    PHASEGATE_API_MAX_BODY_BYTES="4096") as (url, _), \
            httpx.AsyncClient(base_url=url, timeout=10, headers=bearer(tokens["otto"])) as api:
        big = {"workflow": "chain", "input": {"blob": "x" * 5000}}
        assert (await api.post("/v1/workflows", json=big)).status_code == 413

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as read
            yield b'{"workflow": "chain", "input": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}'

        chunked = await api.post("/v1/workflows", content=chunks(),
                                 headers={"Content-Type": "application/json"})
        assert chunked.status_code == 413
        raw = {"Content-Type": "application/json"}
        for body, where in (
                ('{"workflow": "chain", "input": {"a": "x\\u0000y"}}', "body.input.a"),
                ('{"workflow": "chain", "input": ["\\ud800"]}', "body.input[0]"),
                ('{"workflow": "chain\\u0000"}', "body.workflow"),
                ('{"workflow": "chain", "input": ' + "[" * 100 + "]" * 100 + "}",
                 "nested deeper")):
            response = await api.post("/v1/workflows", content=body, headers=raw)
            assert response.status_code == 422, (body[:60], response.text)
            assert where in response.text
        cancel = await api.post("/v1/workflows/r-1/cancel", content='{"reason": "\\u0000"}',
                                headers=raw)
        assert cancel.status_code == 422 and "body.reason" in cancel.text
        for path in ("/v1/workflows?limit=0", "/v1/workflows?limit=100000",
                     "/v1/workflows/r-1/checkpoints?after=99999999999",
                     "/v1/workflows/r-1/checkpoints?after=-1", "/v1/stalls?older_than_s=inf",
                     "/v1/stalls?older_than_s=-1", "/v1/stalls?older_than_s=nan",
                     "/v1/workflows/a%00b", "/v1/workflows?status=a%00b",
                     "/v1/workflows/" + "w" * 300):
            response = await api.get(path)
            assert response.status_code == 422, (path, response.text)
        assert (await api.post("/v1/workflows", content=b"{not json",
                               headers=raw)).status_code == 422
    assert await counts(dsn) == (0, 0, 0, 0)


async def test_the_tokens_file_is_reread_rotation_and_revocation(settings: Settings,
                                                                 tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    first = write_tokens(path, {"old": "viewer"})
    async with orchestrator_process(settings, path) as (url, _), \
            httpx.AsyncClient(base_url=url, timeout=10) as api:
        async def status(token: str) -> int:
            return (await api.get("/v1/summary", headers=bearer(token))).status_code

        assert await status(first["old"]) == 200
        # Rotate: the new line is added next to the old one (written aside, renamed in).
        staged = tmp_path / "tokens.new"
        second = write_tokens(staged, {"new": "viewer"})
        staged.write_text(path.read_text() + staged.read_text())
        staged.replace(path)
        assert await status(second["new"]) == 200 and await status(first["old"]) == 200
        # Revoke the old one by deleting its line.
        kept = [line for line in path.read_text().splitlines() if line.startswith("new ")]
        staged.write_text("\n".join(kept) + "\n")
        staged.replace(path)
        assert await status(first["old"]) == 401 and await status(second["new"]) == 200
        # A broken file keeps the last good one in force (nobody locked out or let in).
        path.write_text("this is not a tokens file\n")
        assert await status(second["new"]) == 200 and await status(first["old"]) == 401


async def test_no_auth_is_refused_off_loopback_and_a_bad_tokens_file_stops_startup(
        settings: Settings, tmp_path: Path) -> None:
    env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(ROOT),
           "PHASEGATE_WORKFLOW_MODULES": "tests.workflows"}
    cases = [({"PHASEGATE_API_AUTH": "none", "PHASEGATE_API_HOST": "0.0.0.0"},
              "PHASEGATE_API_AUTH"),
             ({"PHASEGATE_API_AUTH": "tokens"}, "PHASEGATE_API_TOKENS_FILE"),
             ({"PHASEGATE_API_AUTH": "tokens",
               "PHASEGATE_API_TOKENS_FILE": str(tmp_path / "missing")},
              "PHASEGATE_API_TOKENS_FILE")]
    (tmp_path / "bad").write_text("ada admin not-hex\n")
    cases.append(({"PHASEGATE_API_AUTH": "tokens",
                   "PHASEGATE_API_TOKENS_FILE": str(tmp_path / "bad")}, "line 1"))
    for extra, named in cases:
        run_env = {k: v for k, v in {**env, **extra}.items()
                   if not (k == "PHASEGATE_API_TOKENS_FILE" and k not in extra)}
        done = await asyncio.to_thread(run, ["orchestrator"], run_env)
        assert done.returncode == 2, (extra, done.stderr.decode()[-500:])
        assert named in done.stderr.decode()


async def test_database_down_is_503_not_500(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens", {"val": "viewer"})
    from phasegate.orchestrator.auth import TokenFile

    # Nothing listens on this port: every query fails to connect, as with a database outage.
    pool = await asyncpg.create_pool(f"postgresql://postgres@127.0.0.1:{free_port()}/x",
                                     min_size=0, max_size=1)
    try:
        app = create_app(Services(control=Control(pool, None, Registry()), queue=None,
                                  fleet=FleetView(None, reason="none"),
                                  auth=TokenFile(tmp_path / "tokens")))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://api", headers=bearer(tokens["val"])) as api:
            for path in ("/v1/workflows", "/v1/workflows/r-1", "/v1/summary"):
                response = await api.get(path)
                assert response.status_code == 503, (path, response.text)
                assert "retry" in response.json()["detail"]
    finally:
        await pool.close()


async def test_the_database_refusing_the_orchestrator_is_503_and_health_stays_200(
        settings: Settings, database_url: str, tmp_path: Path) -> None:
    """The real process loses its database login (a disabled user, as after a credentials
    rotation gone wrong): the API answers 503, never 500, and recovers when it is back."""
    from tests.integration.test_access import login_user

    tokens = write_tokens(tmp_path / "tokens", {"val": "viewer"})
    async with login_user(database_url, "phasegate_orchestrator") as dsn:
        user = dsn.split("//", 1)[1].split("@", 1)[0]
        as_user = settings.model_copy(update={"database_url": dsn})
        async with orchestrator_process(as_user, tmp_path / "tokens") as (url, _), \
                httpx.AsyncClient(base_url=url, timeout=10,
                                  headers=bearer(tokens["val"])) as api:
            assert (await api.get("/v1/summary")).status_code == 200
            admin = await asyncpg.connect(database_url)
            try:
                await admin.execute(f'ALTER ROLE "{user}" NOLOGIN')
                await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE usename = $1", user)
                for path in ("/v1/summary", "/v1/workflows", "/v1/workflows/x"):
                    response = await api.get(path)
                    assert response.status_code == 503, (path, response.text)
                assert (await api.get("/healthz")).status_code == 200
                assert (await api.get("/readyz")).status_code == 503
                await admin.execute(f'ALTER ROLE "{user}" LOGIN')
                assert (await api.get("/v1/summary")).status_code == 200
            finally:
                await admin.close()
