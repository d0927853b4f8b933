"""The API's front gate (pure ASGI, before any route runs): authentication, the role each
route needs, the request-size limit, text PostgreSQL cannot hold in the URL, and one access-log
line per ``/v1`` request.

Everything here happens before the body is parsed, so a stranger's request is refused
without FastAPI reading, validating or storing any of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote

import structlog
from starlette.routing import BaseRoute, Match

from phasegate.orchestrator.auth import (
    ADMIN,
    OPERATOR,
    VIEWER,
    Authenticator,
    AuthUnavailable,
    Caller,
)

log = structlog.get_logger("phasegate.api")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Routes anyone may call: probes, metrics and the API's own description.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs",
                        "/docs/oauth2-redirect", "/redoc"})
# The role each /v1 route needs, by route name. A /v1 route missing here needs ADMIN, so a
# new endpoint is closed until someone decides who may call it.
ROUTE_ROLES = {
    "list_runs": VIEWER, "get_run": VIEWER, "checkpoints": VIEWER, "actions": VIEWER,
    "branches": VIEWER, "stalls": VIEWER, "summary": VIEWER, "fleet": VIEWER,
    "start": OPERATOR, "cancel": OPERATOR, "retry": OPERATOR, "restart": OPERATOR,
    "approve": OPERATOR, "reject": OPERATOR, "signal": OPERATOR,
    "merge": ADMIN,
    "quarantine": VIEWER, "redrive": OPERATOR,
}
# The console (orchestrator/console.py) lives at ``/`` and under ``/ui/``. It authenticates
# from its own cookie and enforces these same roles per page and per form; the gate still
# bounds its request bodies and refuses NULs in its URLs.
CONSOLE_PREFIX = "/ui/"


def is_console_path(path: str) -> bool:
    return path == "/" or path.startswith(CONSOLE_PREFIX)


def required_role(route_name: str) -> str:
    return ROUTE_ROLES.get(route_name, ADMIN)


@dataclass(frozen=True)
class Refusal:
    status: int
    detail: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


BEARER_CHALLENGE = ((b"www-authenticate", b'Bearer realm="phasegate"'),)


class Gate:
    def __init__(self, app: ASGIApp, *, auth: Authenticator, routes: list[BaseRoute],
                 max_body_bytes: int) -> None:
        self.app = app
        self.auth = auth
        self.routes = routes
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 0}

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        caller: Caller | None = None
        console = is_console_path(scope["path"])
        try:
            refusal: Refusal | None = None
            if not console:
                caller, refusal = await self._admit(scope)
            if refusal is None:
                refusal = url_problem(scope)
            if refusal is None:
                receive, refusal = await self._limit_body(scope, receive)
            if refusal is not None:
                await respond(send_and_note, refusal)
                return
            if not console:
                scope.setdefault("state", {})["caller"] = caller
            await self.app(scope, receive, send_and_note)
        finally:
            # The access log: who (the token's NAME, never the token), what, and the answer.
            # The console names its caller in the scope once its cookie is checked.
            caller = caller or scope.get("state", {}).get("console_caller")
            log.info("api_request", method=scope["method"], path=scope["path"],
                     status=status["code"], caller=caller.name if caller else None,
                     duration_s=round(time.perf_counter() - started, 6))

    async def _admit(self, scope: Scope) -> tuple[Caller | None, Refusal | None]:
        token = bearer_token(scope)
        try:
            caller = await self.auth.authenticate(token)
        except AuthUnavailable as exc:
            return None, Refusal(503, str(exc))
        if caller is None:
            detail = ("a bearer token is required (Authorization: Bearer TOKEN)"
                      if token is None else "the bearer token is not valid")
            return None, Refusal(401, detail, BEARER_CHALLENGE)
        needed = self._needed(scope)
        if not caller.may(needed):
            return caller, Refusal(403, f"this needs the {needed} role; "
                                        f"{caller.name} has {sorted(caller.roles)}")
        return caller, None

    def _needed(self, scope: Scope) -> str:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return required_role(getattr(route, "name", ""))
        # No route matched (a 404 or 405 to come): a viewer may learn that much, a stranger
        # may not.
        return VIEWER

    async def _limit_body(self, scope: Scope,
                          receive: Receive) -> tuple[Receive, Refusal | None]:
        """Read the body up to the limit, so a large one is refused before it is parsed."""
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return receive, None
        too_large = Refusal(413, f"the request body exceeds {self.max_body_bytes} bytes "
                                 "(PHASEGATE_API_MAX_BODY_BYTES)")
        length = header(scope, b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return receive, too_large if length.isdigit() else Refusal(
                400, "Content-Length must be a number")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return receive, Refusal(400, "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return receive, too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = {"done": False}

        async def replay() -> Message:
            if not replayed["done"]:
                replayed["done"] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay, None


def bearer_token(scope: Scope) -> str | None:
    value = header(scope, b"authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return ""
    return token.strip()


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def url_problem(scope: Scope) -> Refusal | None:
    """A NUL in the path or a query value: PostgreSQL text cannot hold it (422, not 500)."""
    if "\x00" in scope["path"]:
        return Refusal(422, "the path contains a NUL character (\\u0000)")
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    if "%00" in query or "\x00" in unquote(query):
        for name, value in parse_qsl(query, keep_blank_values=True):
            if "\x00" in value or "\x00" in name:
                return Refusal(422, f"query parameter {name!r} contains a NUL character")
        return Refusal(422, "the query string contains a NUL character")
    return None


async def respond(send: Send, refusal: Refusal) -> None:
    body = json.dumps({"detail": refusal.detail}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), *refusal.headers]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
