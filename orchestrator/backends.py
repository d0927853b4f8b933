"""Where the control CLI gets its answers: the orchestrator's HTTP API (``--api URL``) or the
database directly. Both return the API's JSON shapes, so the CLI renders one format."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Protocol

import asyncpg
import httpx

from phasegate.access import policy_from
from phasegate.client import problem_lines
from phasegate.db import pool_from_settings
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.fleet import FleetView
from phasegate.orchestrator.views import ControlError
from phasegate.queue import SqsQueue
from phasegate.settings import Settings
from phasegate.workflow import Registry

ACTIONS = ("cancel", "retry", "restart", "approve", "reject")
# The review decisions, which take an idempotency key (a retry gets the first answer).
DECISIONS = ("approve", "reject")


class BackendError(Exception):
    """The request was refused (``status`` 404/409/422) or the backend is unreachable (0)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Backend(Protocol):
    def summary(self) -> dict[str, Any]: ...
    def fleet(self) -> dict[str, Any]: ...
    def run(self, workflow_id: str) -> dict[str, Any]: ...
    def checkpoints(self, workflow_id: str, include_state: bool) -> dict[str, Any]: ...
    def actions(self, workflow_id: str) -> dict[str, Any]: ...
    def act(self, action: str, workflow_id: str, reason: str | None,
            idempotency_key: str | None = None) -> dict[str, Any]: ...
    def merge(self, workflow_id: str, branch: str, reason: str | None) -> dict[str, Any]: ...
    def branches(self, workflow_id: str) -> dict[str, Any]: ...
    def list_runs(self, filters: dict[str, Any]) -> dict[str, Any]: ...
    def signal(self, workflow_id: str, name: str, payload: Any,
               idempotency_key: str | None) -> dict[str, Any]: ...
    def close(self) -> None: ...


class ApiBackend:
    def __init__(self, url: str, *, timeout_s: float = 10.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        # The API knows the caller (and its roles for the read policy) by its bearer token
        # (PHASEGATE_API_TOKEN, docs/how-to/security.md).
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers)

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise BackendError(f"cannot reach the API at {self.url}: "
                               f"{type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            # One line per problem: a 422 names each refused input (its field path) in turn.
            raise BackendError("\n".join(problem_lines(detail)), response.status_code)
        body: dict[str, Any] = response.json()
        return body

    def summary(self) -> dict[str, Any]:
        return self._call("GET", "/v1/summary")

    def fleet(self) -> dict[str, Any]:
        return self._call("GET", "/v1/fleet")

    def run(self, workflow_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/workflows/{workflow_id}")

    def checkpoints(self, workflow_id: str, include_state: bool) -> dict[str, Any]:
        params = {"include": "state"} if include_state else {}
        return self._call("GET", f"/v1/workflows/{workflow_id}/checkpoints", params=params)

    def actions(self, workflow_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/workflows/{workflow_id}/actions")

    def act(self, action: str, workflow_id: str, reason: str | None,
            idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        return self._call("POST", f"/v1/workflows/{workflow_id}/{action}",
                          json={"reason": reason}, headers=headers)

    def merge(self, workflow_id: str, branch: str, reason: str | None) -> dict[str, Any]:
        return self._call("POST", f"/v1/workflows/{workflow_id}/merge",
                          json={"branch": branch, "reason": reason})

    def branches(self, workflow_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/workflows/{workflow_id}/branches")

    def list_runs(self, filters: dict[str, Any]) -> dict[str, Any]:
        params = {k: v for k, v in filters.items() if v is not None}
        return self._call("GET", "/v1/workflows", params=params)
    def signal(self, workflow_id: str, name: str, payload: Any,
               idempotency_key: str | None) -> dict[str, Any]:
        return self._call("POST", f"/v1/workflows/{workflow_id}/signals/{name}",
                          json={"payload": payload, "idempotency_key": idempotency_key})

    def close(self) -> None:
        self._client.close()


class DatabaseBackend:
    """Talks to PostgreSQL (and SQS, to send resuming messages) from this process."""

    def __init__(self, settings: Settings, registry: Registry, *,
                 fleet: FleetView | None = None, role: str | None = None) -> None:
        self.settings = settings
        self.role = role
        self.registry = registry
        self._fleet = fleet or FleetView.from_environment()
        self._runner = asyncio.Runner()
        self._control: Control | None = None
        self._queue: SqsQueue | None = None

    async def _open(self) -> Control:
        if self._control is None:
            settings = self.settings
            try:
                pool = await pool_from_settings(settings, min_size=1, max_size=2)
            except Exception as exc:
                raise BackendError("cannot reach PostgreSQL at PHASEGATE_DATABASE_URL: "
                                   f"{type(exc).__name__}: {exc}") from None
            if settings.queue_url:
                self._queue = await SqsQueue(settings.queue_url,
                                             endpoint_url=settings.sqs_endpoint_url,
                                             region=settings.aws_region).open()
            self._control = Control(pool, self._queue, self.registry, actor="cli",
                                    read_policy=policy_from(settings.read_policy))
        return self._control

    def _do(self, fn: Any) -> dict[str, Any]:
        async def call() -> dict[str, Any]:
            try:
                result: dict[str, Any] = await fn(await self._open())
                return result
            except ControlError as exc:
                raise BackendError(exc.reason, exc.status_code) from None
            except asyncpg.UndefinedTableError:
                raise BackendError("the database has no phasegate schema: run "
                                   "`phasegate migrate` against it first") from None
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                raise BackendError(f"PostgreSQL failed the request: {type(exc).__name__}"
                                   ) from None

        return self._runner.run(call())

    def summary(self) -> dict[str, Any]:
        from phasegate.orchestrator.api import Services, queue_state
        from phasegate.orchestrator.api_models import QueueState

        async def get(control: Control) -> dict[str, Any]:
            rows = await control.views.summary()
            queue: QueueState = await queue_state(Services(control, self._queue, self._fleet))
            return {"runs": [r.model_dump(mode="json") for r in rows],
                    "queue": queue.model_dump(mode="json")}

        return self._do(get)

    def fleet(self) -> dict[str, Any]:
        from phasegate.orchestrator.api import Services, fleet_report

        async def get(control: Control) -> dict[str, Any]:
            report = await fleet_report(Services(control, self._queue, self._fleet))
            return report.model_dump(mode="json")

        return self._do(get)

    def run(self, workflow_id: str) -> dict[str, Any]:
        async def get(control: Control) -> dict[str, Any]:
            return (await control.views.get_run(workflow_id)).model_dump(mode="json")

        return self._do(get)

    def checkpoints(self, workflow_id: str, include_state: bool) -> dict[str, Any]:
        async def get(control: Control) -> dict[str, Any]:
            page = await control.views.checkpoints(
                workflow_id, include_state=include_state,
                roles=frozenset({self.role}) if self.role else None)
            return page.model_dump(mode="json")

        return self._do(get)

    def actions(self, workflow_id: str) -> dict[str, Any]:
        async def get(control: Control) -> dict[str, Any]:
            return {"workflow_id": workflow_id,
                    "actions": [a.model_dump(mode="json")
                                for a in await control.views.actions(workflow_id)]}

        return self._do(get)

    def act(self, action: str, workflow_id: str, reason: str | None,
            idempotency_key: str | None = None) -> dict[str, Any]:
        assert action in ACTIONS
        assert idempotency_key is None or action in DECISIONS
        keyed = {"idempotency_key": idempotency_key} if action in DECISIONS else {}

        async def do(control: Control) -> dict[str, Any]:
            outcome = await getattr(control, action)(workflow_id, reason, **keyed)
            return {"action": outcome.action, "run": outcome.run.model_dump(mode="json"),
                    "sent": outcome.sent}

        return self._do(do)

    def merge(self, workflow_id: str, branch: str, reason: str | None) -> dict[str, Any]:
        async def do(control: Control) -> dict[str, Any]:
            outcome = await control.merge(workflow_id, branch, reason)
            return {"action": outcome.action, "run": outcome.run.model_dump(mode="json"),
                    "sent": outcome.sent}

        return self._do(do)

    def branches(self, workflow_id: str) -> dict[str, Any]:
        async def get(control: Control) -> dict[str, Any]:
            return {"workflow_id": workflow_id, "forks": await control.branches(workflow_id)}

        return self._do(get)

    def list_runs(self, filters: dict[str, Any]) -> dict[str, Any]:
        async def get(control: Control) -> dict[str, Any]:
            return (await control.views.list_runs(**filters)).model_dump(mode="json")

        return self._do(get)
    def signal(self, workflow_id: str, name: str, payload: Any,
               idempotency_key: str | None) -> dict[str, Any]:
        async def do(control: Control) -> dict[str, Any]:
            result = await control.signal(workflow_id, name, payload, idempotency_key)
            return dataclasses.asdict(result)

        return self._do(do)

    def close(self) -> None:
        async def shut() -> None:
            if self._queue is not None:
                await self._queue.close()
            if self._control is not None:
                await self._control.pool.close()

        try:
            self._runner.run(shut())
        finally:
            self._runner.close()
            self._fleet.close()
