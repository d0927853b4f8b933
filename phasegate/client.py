"""A Python client of the orchestrator's HTTP API: start, inspect and steer runs with a token.

A producer needs neither database nor SQS credentials nor the workflow code, only the API's
URL and a token (docs/how-to/client.md)::

    from phasegate.client import Client

    with Client("http://phasegate-orchestrator:8080", token=TOKEN) as api:
        run = api.start("storm-intel", {"region": "gulf"})
        run = api.wait(run.workflow_id, timeout=600)

``AsyncClient`` has the same methods as coroutines. ``wait`` long-polls
``GET /v1/workflows/{id}?wait=S``: the server holds each request until the run settles or
the poll ends, so waiting costs one request every ``MAX_POLL_S`` seconds, not a busy loop.
Refusals are typed exceptions carrying the API's own message.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import httpx

# The server bounds one long poll at 30 s (orchestrator/api.py MAX_WAIT_S); the client asks
# for a little less so a proxy's 30 s idle timeout does not cut it.
MAX_POLL_S = 25.0
# Statuses in which a run moves on by itself; ``wait`` returns on any other one.
MOVING = frozenset({"pending", "running", "waiting", "queued"})
TERMINAL = frozenset({"completed", "failed", "cancelled"})
DEFAULT_TIMEOUT_S = 30.0


class ApiError(Exception):
    """The API refused a request; ``status`` is its HTTP status, ``detail`` its message, and
    ``problems`` the same one line per problem (a 422 can name several fields)."""

    def __init__(self, status: int, detail: str, problems: list[str] | None = None) -> None:
        super().__init__(f"HTTP {status}: {detail}" if status else detail)
        self.status = status
        self.detail = detail
        self.problems = problems or [detail]


class Unauthenticated(ApiError):
    """401: no token, or not a valid one."""


class Forbidden(ApiError):
    """403: the token's roles do not include the one this call needs."""


class NotFound(ApiError):
    """404: no run with this id."""


class Conflict(ApiError):
    """409: the run's status does not allow this (the message says what it needs)."""


class InvalidRequest(ApiError):
    """422: bad input (an unknown workflow, a malformed id, ...)."""


class Unavailable(ApiError):
    """503, or the API could not be reached at all (``status`` 0)."""


class WaitTimeout(Exception):
    """``wait`` gave up; ``run`` is the run as last seen."""

    def __init__(self, run: Run, timeout: float) -> None:
        super().__init__(f"run {run.workflow_id} is still {run.status!r} after {timeout}s")
        self.run = run


ERRORS: dict[int, type[ApiError]] = {401: Unauthenticated, 403: Forbidden, 404: NotFound,
                                     409: Conflict, 422: InvalidRequest, 503: Unavailable}


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


@dataclass(frozen=True)
class Run:
    """A workflow run as the API reports it (``GET /v1/workflows/{id}``)."""

    workflow_id: str
    workflow: str
    status: str
    seq: int
    current_phase: str | None
    tier: int | None
    tier_label: str | None
    attempts: int
    error: str | None
    created_at: datetime | None
    updated_at: datetime | None
    finished_at: datetime | None
    classification: str = "internal"
    region: str | None = None
    # A `waiting` run: when its next phase becomes deliverable (database time), and the
    # signal it waits for (None: a timer).
    due_at: datetime | None = None
    waiting_for: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def settled(self) -> bool:
        """Not moving on by itself: finished, or waiting for a person."""
        return self.status not in MOVING

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Run:
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {k: body.get(k) for k in known}
        for name in ("created_at", "updated_at", "finished_at", "due_at"):
            values[name] = _time(body.get(name))
        values["attempts"] = int(body.get("attempts") or 0)
        values["classification"] = body.get("classification") or "internal"
        # Fields a newer server adds are kept, not dropped and not an error.
        return cls(**values, extra={k: v for k, v in body.items() if k not in known})


@dataclass(frozen=True)
class RunPage:
    runs: list[Run]
    next_cursor: str | None


@dataclass(frozen=True)
class SignalSent:
    """What a signal did: ``delivered`` (it ended the run's wait for its name), ``duplicate``
    (its idempotency key was seen before: nothing changed), neither (kept until the run waits
    for it); ``sent`` False means the relay sends the woken run's message."""

    workflow_id: str
    name: str
    signal_id: int
    delivered: bool
    duplicate: bool
    sent: bool

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SignalSent:
        return cls(body["workflow_id"], body["name"], int(body["signal_id"]),
                   bool(body["delivered"]), bool(body["duplicate"]), bool(body["sent"]))


def _signal_body(payload: Any, idempotency_key: str | None) -> dict[str, Any]:
    return {"payload": payload, "idempotency_key": idempotency_key}


def _key_header(idempotency_key: str | None) -> dict[str, str]:
    # The header, as the API's review decisions take it (the signal route takes it in the body).
    return {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}


@dataclass(frozen=True)
class ActionResult:
    """What an action did: the run as it is now; ``sent`` False means the relay sends it."""

    action: str
    run: Run
    sent: bool | None


def token_from_environment() -> str | None:
    """``PHASEGATE_API_TOKEN``, else the first line of the file ``PHASEGATE_API_TOKEN_FILE``
    names (a mounted Secret)."""
    token = os.environ.get("PHASEGATE_API_TOKEN")
    if token:
        return token.strip()
    path = os.environ.get("PHASEGATE_API_TOKEN_FILE")
    if path:
        lines = Path(path).read_text().strip().splitlines()
        return lines[0].strip() if lines else None
    return None


def problem_lines(detail: Any) -> list[str]:
    """An error answer's ``detail`` for a person: the message, or for a 422 from validation
    (a list of ``{loc, msg}``) one ``field.path: message`` line per refused input."""
    if isinstance(detail, str):
        return [detail]
    lines = [f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}"
             for d in detail if isinstance(d, dict)] if isinstance(detail, list) else []
    return lines or [str(detail)]


def _error(response: httpx.Response) -> ApiError:
    try:
        detail: Any = response.json().get("detail", response.text)
    except ValueError:
        detail = response.text
    problems = problem_lines(detail)
    return ERRORS.get(response.status_code, ApiError)(response.status_code, "; ".join(problems),
                                                      problems)


def _path(workflow_id: str, *rest: str) -> str:
    return "/".join(["/v1/workflows", quote(workflow_id, safe=""), *rest])


class _Requests:
    """What both clients send: method, path and body per call (no I/O here)."""

    @staticmethod
    def start(workflow: str, input: Any, workflow_id: str | None,
              classification: str | None, region: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"workflow": workflow, "input": input}
        for key, value in (("id", workflow_id), ("classification", classification),
                           ("region", region)):
            if value is not None:
                body[key] = value
        return body

    @staticmethod
    def list_params(status: str | None, workflow: str | None, phase: str | None,
                    limit: int, cursor: str | None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("status", status), ("workflow", workflow), ("phase", phase),
                           ("cursor", cursor)):
            if value is not None:
                params[key] = value
        return params


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class Client:
    """The synchronous client. ``token`` defaults to ``token_from_environment()``."""

    def __init__(self, url: str, *, token: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout
        self._http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport,
                                  headers=_headers(token or token_from_environment()))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None
                 ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, *, timeout: float | None = None,
              **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, timeout=timeout or self._timeout,
                                          **kwargs)
        except httpx.HTTPError as exc:
            raise Unavailable(0, f"cannot reach the API at {self.url}: "
                                 f"{type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            raise _error(response)
        return response.json()

    def start(self, workflow: str, input: Any = None, *, workflow_id: str | None = None,
              classification: str | None = None, region: str | None = None) -> Run:
        """Start a run (idempotent on ``workflow_id``: a repeat returns the existing run)."""
        body = _Requests.start(workflow, input, workflow_id, classification, region)
        return Run.from_json(self._call("POST", "/v1/workflows", json=body))

    def get(self, workflow_id: str) -> Run:
        return Run.from_json(self._call("GET", _path(workflow_id)))

    def wait(self, workflow_id: str, *, timeout: float = 300.0) -> Run:
        """The run once it is settled (completed, failed, cancelled, awaiting review, ...);
        ``WaitTimeout`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            poll = max(0.0, min(MAX_POLL_S, left))
            run = Run.from_json(self._call("GET", _path(workflow_id), params={"wait": poll},
                                           timeout=poll + self._timeout))
            if run.settled:
                return run
            if time.monotonic() >= deadline:
                raise WaitTimeout(run, timeout)

    def list(self, *, status: str | None = None, workflow: str | None = None,
             phase: str | None = None, limit: int = 50, cursor: str | None = None) -> RunPage:
        """One page of runs, newest first; pass ``next_cursor`` for the next page."""
        body = self._call("GET", "/v1/workflows", params=_Requests.list_params(
            status, workflow, phase, limit, cursor))
        return RunPage([Run.from_json(r) for r in body["runs"]], body.get("next_cursor"))

    def iter_runs(self, **filters: Any) -> Iterator[Run]:
        """Every run matching ``filters``, page by page."""
        cursor = None
        while True:
            page = self.list(**filters, cursor=cursor)
            yield from page.runs
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def _act(self, action: str, workflow_id: str, reason: str | None,
             idempotency_key: str | None = None) -> ActionResult:
        body = self._call("POST", _path(workflow_id, action), json={"reason": reason},
                          headers=_key_header(idempotency_key))
        return ActionResult(body["action"], Run.from_json(body["run"]), body.get("sent"))

    def cancel(self, workflow_id: str, reason: str | None = None) -> ActionResult:
        return self._act("cancel", workflow_id, reason)

    def retry(self, workflow_id: str, reason: str | None = None) -> ActionResult:
        return self._act("retry", workflow_id, reason)

    def approve(self, workflow_id: str, reason: str | None = None, *,
                idempotency_key: str | None = None) -> ActionResult:
        """Continue a run awaiting review. With ``idempotency_key`` (1-200 visible ASCII
        characters), a retry of the call gets the first answer instead of a ``Conflict``."""
        return self._act("approve", workflow_id, reason, idempotency_key)

    def reject(self, workflow_id: str, reason: str | None = None, *,
               idempotency_key: str | None = None) -> ActionResult:
        """Re-run the phase under review; ``idempotency_key`` as for ``approve``."""
        return self._act("reject", workflow_id, reason, idempotency_key)

    def signal(self, workflow_id: str, name: str, payload: Any = None, *,
               idempotency_key: str | None = None) -> SignalSent:
        """Send signal ``name`` with a JSON ``payload`` (operator role): it ends the run's
        ``ctx.wait_for_signal(name)`` or is kept until one; the same key is delivered once."""
        body = self._call("POST", _path(workflow_id, "signals", quote(name, safe="")),
                          json=_signal_body(payload, idempotency_key))
        return SignalSent.from_json(body)


class AsyncClient:
    """The asyncio client: the same methods as ``Client``, as coroutines."""

    def __init__(self, url: str, *, token: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self._timeout = timeout
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout,
                                       transport=transport,
                                       headers=_headers(token or token_from_environment()))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None
                        ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, *, http_timeout: float | None = None,
                    **kwargs: Any) -> Any:
        try:
            response = await self._http.request(method, path,
                                                timeout=http_timeout or self._timeout,
                                                **kwargs)
        except httpx.HTTPError as exc:
            raise Unavailable(0, f"cannot reach the API at {self.url}: "
                                 f"{type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            raise _error(response)
        return response.json()

    async def start(self, workflow: str, input: Any = None, *, workflow_id: str | None = None,
                    classification: str | None = None, region: str | None = None) -> Run:
        body = _Requests.start(workflow, input, workflow_id, classification, region)
        return Run.from_json(await self._call("POST", "/v1/workflows", json=body))

    async def get(self, workflow_id: str) -> Run:
        return Run.from_json(await self._call("GET", _path(workflow_id)))

    # The same signature as Client.wait: the deadline spans many long polls, which
    # asyncio.timeout around the call could not express as "return the run as last seen".
    async def wait(self, workflow_id: str, *, timeout: float = 300.0) -> Run:  # noqa: ASYNC109
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            poll = max(0.0, min(MAX_POLL_S, deadline - loop.time()))
            run = Run.from_json(await self._call("GET", _path(workflow_id),
                                                 params={"wait": poll},
                                                 http_timeout=poll + self._timeout))
            if run.settled:
                return run
            if loop.time() >= deadline:
                raise WaitTimeout(run, timeout)

    async def list(self, *, status: str | None = None, workflow: str | None = None,
                   phase: str | None = None, limit: int = 50,
                   cursor: str | None = None) -> RunPage:
        body = await self._call("GET", "/v1/workflows", params=_Requests.list_params(
            status, workflow, phase, limit, cursor))
        return RunPage([Run.from_json(r) for r in body["runs"]], body.get("next_cursor"))

    async def _act(self, action: str, workflow_id: str, reason: str | None,
                   idempotency_key: str | None = None) -> ActionResult:
        body = await self._call("POST", _path(workflow_id, action), json={"reason": reason},
                                headers=_key_header(idempotency_key))
        return ActionResult(body["action"], Run.from_json(body["run"]), body.get("sent"))

    async def cancel(self, workflow_id: str, reason: str | None = None) -> ActionResult:
        return await self._act("cancel", workflow_id, reason)

    async def retry(self, workflow_id: str, reason: str | None = None) -> ActionResult:
        return await self._act("retry", workflow_id, reason)

    async def approve(self, workflow_id: str, reason: str | None = None, *,
                      idempotency_key: str | None = None) -> ActionResult:
        """Continue a run awaiting review (see ``Client.approve``)."""
        return await self._act("approve", workflow_id, reason, idempotency_key)

    async def reject(self, workflow_id: str, reason: str | None = None, *,
                     idempotency_key: str | None = None) -> ActionResult:
        """Re-run the phase under review (see ``Client.approve``)."""
        return await self._act("reject", workflow_id, reason, idempotency_key)

    async def signal(self, workflow_id: str, name: str, payload: Any = None, *,
                     idempotency_key: str | None = None) -> SignalSent:
        """Send signal ``name`` with a JSON ``payload`` (see ``Client.signal``)."""
        body = await self._call("POST", _path(workflow_id, "signals", quote(name, safe="")),
                                json=_signal_body(payload, idempotency_key))
        return SignalSent.from_json(body)


__all__ = ["ActionResult", "ApiError", "AsyncClient", "Client", "Conflict", "Forbidden",
           "InvalidRequest", "NotFound", "Run", "RunPage", "SignalSent", "Unauthenticated",
           "Unavailable",
           "WaitTimeout", "token_from_environment"]
