"""The orchestrator's HTTP API (FastAPI; OpenAPI at ``/openapi.json``, pages at ``/docs``).

Versioned under ``/v1``. It reads and steers the tables the worker writes and keeps no state
of its own; every start and every resume goes through the outbox in the same statement as
the run row, so a crash of this process never loses one.

This module builds the app: its error handlers, the routes that start and read runs, the
operations routes and the probes. The routes that steer a run are in ``api_steering.py``; the
bodies and parameter types all routes share are in ``api_models.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import asyncpg
from fastapi import FastAPI, Query, Request, Response
from fastapi import Path as Path_
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from phasegate.limits import SQS_MAX_MESSAGE_BYTES
from phasegate.orchestrator import exporter as _exporter  # noqa: F401  (its series are always served)
from phasegate.orchestrator.api_models import (
    BODY_ERRORS,
    ERRORS,
    GATE_ERRORS,
    CallerDep,
    FleetReport,
    QueueState,
    StartRequest,
    Summary,
    WorkflowId,
)
from phasegate.orchestrator.api_steering import add_steering_routes
from phasegate.orchestrator.auth import Authenticator, Caller, NoAuth
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.fleet import FleetView
from phasegate.orchestrator.gate import OPEN_PATHS, Gate, is_console_path, required_role
from phasegate.orchestrator.quarantine import MAX_PAGE as QUARANTINE_PAGE
from phasegate.orchestrator.quarantine import QuarantinePage, Redriven, list_quarantine
from phasegate.orchestrator.quarantine import redrive as redrive_quarantined
from phasegate.orchestrator.views import (
    CheckpointPage,
    ControlError,
    LiveWorker,
    Run,
    RunPage,
    StallReport,
)
from phasegate.presence import live_workers
from phasegate.queue import Queue
from phasegate.signals import IDEMPOTENCY_KEY_PATTERN, IDEMPOTENCY_KEY_RULE
from phasegate.sql import queries
from phasegate.waits import SIGNAL_NAME, SIGNAL_NAME_RULE

READY_TIMEOUT_S = 3.0
DEFAULT_STALL_S = 600.0
# Seqs and cursors are PostgreSQL integers; a larger value is a 422, not an overflow (500).
MAX_INT4 = 2**31 - 1
# GET /v1/workflows/{id}?wait=S holds the request at most this long (a long poll for clients
# waiting for a run to settle); the server re-reads the run row between these bounds.
MAX_WAIT_S = 30.0
WAIT_POLL_S = (0.1, 1.0)
# Statuses in which a run moves on by itself; a long poll returns as soon as a run is in any
# other one (finished, or waiting for a person), including statuses this code does not know.
MOVING = ("pending", "running", "waiting", "queued")
# A stall threshold of ten years is "never"; beyond it the interval arithmetic overflows.
MAX_STALL_S = 10 * 365 * 86400.0
# GET .../checkpoints?include=state: the one thing a checkpoint page can include.
INCLUDE_PATTERN = "^state$"
INCLUDE_RULE = "include is state (each checkpoint's state) or absent"
# A 422 for one of these patterns says the rule in words ("String should match pattern
# '^[!-~]{1,200}$'" names the field but leaves the caller to read a regular expression).
# Every pattern a route declares is here (tests/integration/test_api.py checks it).
PATTERN_RULES = {IDEMPOTENCY_KEY_PATTERN: IDEMPOTENCY_KEY_RULE,
                 SIGNAL_NAME.pattern: SIGNAL_NAME_RULE,
                 INCLUDE_PATTERN: INCLUDE_RULE}


@dataclass
class Services:
    control: Control
    queue: Queue | None
    fleet: FleetView
    # Who may call /v1. Built from PHASEGATE_API_AUTH by the orchestrator; the default here
    # is for in-process callers (the CLI's summary) that never serve HTTP.
    auth: Authenticator = field(default_factory=NoAuth)
    max_body_bytes: int = SQS_MAX_MESSAGE_BYTES
    # The console's login cookie: Secure always (True), never (False), or when the request
    # came over https (None; PHASEGATE_CONSOLE_SECURE_COOKIE=auto).
    secure_cookie: bool | None = None


# The database is down or the connection broke: 503, so a client retries, never a 500.
# InternalClientError: asyncpg's state machine on a connection the server just terminated
# ("cannot switch to state ..."), seen when a login is disabled under load.
UNAVAILABLE = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
               asyncpg.InternalClientError, OSError, asyncio.TimeoutError)
# SQLSTATE classes that mean "not now" rather than "wrong": connection exceptions, refused
# credentials (a rotated password, a disabled login), too many connections / out of
# resources, and an administrator's shutdown or a starting server.
UNAVAILABLE_SQLSTATE = ("08", "28", "53", "57")


def create_app(services: Services) -> FastAPI:
    app = FastAPI(title="phasegate orchestrator", version="1",
                  description="Start, inspect and steer phasegate workflow runs. Every /v1 "
                              "route needs a bearer token with the role its description "
                              "names (viewer < operator < admin).")
    app.state.services = services

    @app.exception_handler(ControlError)
    async def control_error(request: Request, exc: ControlError) -> JSONResponse:
        return JSONResponse({"detail": exc.reason}, status_code=exc.status_code)

    async def unavailable(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": f"the database is unavailable ({type(exc).__name__}); "
                                       "retry later"}, status_code=503)

    for error in UNAVAILABLE:
        app.add_exception_handler(error, unavailable)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Where and why, never the value: an echoed input could be large, could hold text
        # JSON cannot encode (a lone surrogate), and is the caller's data, not ours to log.
        errors = [{"loc": [str(part) for part in e.get("loc", ())],
                   "msg": validation_message(e), "type": str(e.get("type", ""))}
                  for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(asyncpg.PostgresError)
    async def postgres_error(request: Request, exc: asyncpg.PostgresError) -> JSONResponse:
        if str(getattr(exc, "sqlstate", "") or "").startswith(UNAVAILABLE_SQLSTATE):
            return await unavailable(request, exc)
        raise exc

    def control_for(caller: Caller) -> Control:
        return services.control.acting_as(caller.name)

    @app.post("/v1/workflows", status_code=201, response_model=Run,
              responses={200: {"model": Run, "description": "The run with this id existed"},
                         422: {"description": "Unknown workflow or bad input"}, **BODY_ERRORS})
    async def start(request: StartRequest, response: Response, caller: CallerDep) -> Run:
        control = control_for(caller)
        run, created = await control.start(request.workflow, request.input, request.id,
                                           classification=request.classification,
                                           region=request.region)
        if not created:
            response.status_code = 200
        return run

    @app.get("/v1/workflows/{workflow_id}", response_model=Run, responses=ERRORS)
    async def get_run(workflow_id: WorkflowId, wait: Annotated[float, Query(
            ge=0, le=MAX_WAIT_S, allow_inf_nan=False,
            description="Hold the answer up to this many seconds while the run is still "
                        "moving on its own (pending, running, waiting, queued); it returns "
                        "as soon as the run is in any other status.")] = 0) -> Run:
        views = (await services.control.scoped(workflow_id)).views
        run = await views.get_run(workflow_id)
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + wait, WAIT_POLL_S[0]
        while run.status in MOVING and loop.time() < deadline:
            await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
            pause = min(pause * 2, WAIT_POLL_S[1])
            run = await views.get_run(workflow_id)
        return run

    @app.get("/v1/workflows", response_model=RunPage)
    async def list_runs(
            status: Annotated[str | None, Query(max_length=64)] = None,
            workflow: Annotated[str | None, Query(max_length=200)] = None,
            phase: Annotated[str | None, Query(max_length=200)] = None,
            limit: Annotated[int, Query(ge=1, le=500)] = 50,
            cursor: Annotated[str | None, Query(max_length=500)] = None) -> RunPage:
        return await services.control.views.list_runs(
            status=status, workflow=workflow, phase=phase, limit=limit, cursor=cursor)

    @app.get("/v1/workflows/{workflow_id}/checkpoints", response_model=CheckpointPage,
             responses=ERRORS)
    async def checkpoints(
            workflow_id: WorkflowId, caller: CallerDep,
            include: Annotated[str | None, Query(pattern=INCLUDE_PATTERN)] = None,
            after: Annotated[int, Query(ge=0, le=MAX_INT4)] = 0,
            limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
    ) -> CheckpointPage:
        """With ``include=state``, each checkpoint's state as the read policy
        (PHASEGATE_READ_POLICY) allows for the token's roles; every read is logged."""
        scoped = await control_for(caller).scoped(workflow_id)
        return await scoped.views.checkpoints(workflow_id, include_state=include == "state",
                                              after=after, limit=limit, roles=caller.roles)

    @app.get("/v1/workflows/{workflow_id}/actions", responses=ERRORS)
    async def actions(workflow_id: WorkflowId) -> dict[str, Any]:
        scoped = await services.control.scoped(workflow_id)
        await scoped.views.get_run(workflow_id)
        return {"workflow_id": workflow_id,
                "actions": [a.model_dump(mode="json")
                            for a in await scoped.views.actions(workflow_id)]}

    add_steering_routes(app, services.control)

    @app.get("/v1/workflows/{workflow_id}/branches", responses=ERRORS)
    async def branches(workflow_id: WorkflowId) -> dict[str, Any]:
        scoped = await services.control.scoped(workflow_id)
        return {"workflow_id": workflow_id, "forks": await scoped.branches(workflow_id)}

    @app.get("/v1/quarantine", response_model=QuarantinePage)
    async def quarantine(
            before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
            limit: Annotated[int, Query(ge=1, le=QUARANTINE_PAGE)] = 50) -> QuarantinePage:
        """Quarantined messages, newest first: the reason, never the body."""
        return await list_quarantine(services.control, before=before, limit=limit)

    @app.post("/v1/quarantine/{quarantine_id}/redrive", response_model=Redriven,
              responses={**ERRORS, **BODY_ERRORS})
    async def redrive(quarantine_id: Annotated[int, Path_(ge=1, le=2**63 - 1)],
                      caller: CallerDep) -> Redriven:
        """Resend the current phase of the run a quarantined message belonged to, rebuilt
        from the run row (never from the message body); once per quarantined message."""
        return await redrive_quarantined(control_for(caller), quarantine_id)

    @app.get("/v1/stalls", response_model=StallReport)
    async def stalls(older_than_s: Annotated[float, Query(
                         ge=0, le=MAX_STALL_S, allow_inf_nan=False)] = DEFAULT_STALL_S,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> StallReport:
        return await services.control.views.stalls(older_than_s, limit)

    @app.get("/v1/summary", response_model=Summary)
    async def summary() -> Summary:
        runs, queue = await asyncio.gather(services.control.views.summary(),
                                           queue_state(services))
        return Summary(runs=runs, queue=queue)

    @app.get("/v1/fleet", response_model=FleetReport)
    async def fleet() -> FleetReport:
        """The worker pods (in a cluster), the queue, the live workers and message ages."""
        return await fleet_report(services)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok\n"

    @app.get("/readyz", response_class=PlainTextResponse,
             responses={503: {"description": "PostgreSQL or SQS unreachable"}})
    async def readyz() -> PlainTextResponse:
        problems = await readiness_problems(services)
        if problems:
            return PlainTextResponse("not ready: " + "; ".join(problems) + "\n", 503)
        return PlainTextResponse("ready\n")

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    from phasegate.orchestrator.console import mount_console

    mount_console(app, services)
    describe_roles(app)
    app.add_middleware(Gate, auth=services.auth, routes=app.router.routes,
                       max_body_bytes=services.max_body_bytes)
    return app


def validation_message(error: Mapping[str, Any]) -> str:
    """pydantic's message for one refused input, or, for a pattern a person cannot read at a
    glance, the rule it encodes in words."""
    pattern = (error.get("ctx") or {}).get("pattern")
    return PATTERN_RULES.get(str(pattern), str(error.get("msg", "invalid")))


def describe_roles(app: FastAPI) -> None:
    """Name each /v1 route's role in its OpenAPI description and declare the bearer scheme."""
    from fastapi.openapi.utils import get_openapi
    from fastapi.routing import APIRoute

    for route in app.routes:
        if isinstance(route, APIRoute) and route.path not in OPEN_PATHS \
                and not is_console_path(route.path):
            role = required_role(route.name)
            note = f"Needs a token with the **{role}** role (or higher)."
            route.description = f"{route.description}\n\n{note}".strip()
            route.responses = {**route.responses, **GATE_ERRORS}
            route.openapi_extra = {"security": [{"bearer": []}]}

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "A token from `phasegate token new` "
                                          "(PHASEGATE_API_AUTH=tokens) or a ServiceAccount "
                                          "token (PHASEGATE_API_AUTH=kubernetes)."}}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


async def queue_state(services: Services) -> QueueState:
    if services.queue is None:
        return QueueState(error="no queue configured (PHASEGATE_QUEUE_URL)")
    try:
        depth = await asyncio.wait_for(services.queue.depth(), READY_TIMEOUT_S)
    except Exception as exc:
        return QueueState(error=f"{type(exc).__name__}: {exc}"[:200])
    return QueueState(visible=depth.visible, inflight=depth.inflight, delayed=depth.delayed)


async def fleet_report(services: Services) -> FleetReport:
    """What the console's fleet page shows, from the same calls (orchestrator/console.py)."""
    control = services.control
    snapshot, queue, workers, ages = await asyncio.gather(
        services.fleet.snapshot(), queue_state(services), live_workers(control.pool),
        control.views.message_ages())
    return FleetReport(fleet=snapshot, queue=queue, ages=ages,
                       workers=[LiveWorker.model_validate(w, from_attributes=True)
                                for w in workers])


async def readiness_problems(services: Services) -> list[str]:
    problems = []
    try:
        ping = queries("schema.sql")["ping"]
        await asyncio.wait_for(services.control.pool.fetchval(ping), READY_TIMEOUT_S)
    except Exception as exc:
        problems.append(f"postgres: {type(exc).__name__}")
    queue = await queue_state(services)
    if queue.error is not None:
        problems.append(f"sqs: {queue.error}")
    return problems
