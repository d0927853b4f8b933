"""The orchestrator's HTTP API (FastAPI; OpenAPI at ``/openapi.json``, pages at ``/docs``).

Versioned under ``/v1``. It reads and steers the tables the worker writes and keeps no state
of its own; every start and every resume goes through the outbox in the same statement as
the run row, so a crash of this process never loses one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Body, FastAPI, Header, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from pydantic import BaseModel, Field

from phasegate.access import ROLE_PATTERN
from phasegate.orchestrator import exporter as _exporter  # noqa: F401  (its series are always served)
from phasegate.orchestrator.control import Control, Outcome
from phasegate.orchestrator.fleet import Fleet, FleetView
from phasegate.orchestrator.views import (
    CheckpointPage,
    ControlError,
    Invalid,
    Run,
    RunPage,
    StallReport,
    SummaryRow,
)
from phasegate.queue import Queue
from phasegate.sql import queries

READY_TIMEOUT_S = 3.0
DEFAULT_STALL_S = 600.0


@dataclass
class Services:
    control: Control
    queue: Queue | None
    fleet: FleetView


class StartRequest(BaseModel):
    workflow: str = Field(min_length=1, max_length=200)
    input: Any = None
    id: str | None = Field(default=None, description="Opaque id; a repeat returns the run.")
    classification: Literal["public", "internal", "sensitive", "regulated"] | None = Field(
        default=None, description="Default internal; sensitive and regulated need a region.")
    region: str | None = Field(
        default=None, description="The store (PHASEGATE_STORES) the run lives in; fixed.")


class MergeRequest(BaseModel):
    branch: str = Field(min_length=1, max_length=26, description="The branch to promote.")
    reason: str | None = Field(default=None, max_length=1000)


class ActionRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=1000)


class ActionResponse(BaseModel):
    action: str
    run: Run
    sent: bool | None = Field(
        default=None, description="False: the resuming message is in the outbox and the "
                                  "relay will send it.")


class QueueState(BaseModel):
    visible: int | None = None
    inflight: int | None = None
    delayed: int | None = None
    error: str | None = None


class Summary(BaseModel):
    runs: list[SummaryRow]
    queue: QueueState


class FleetReport(BaseModel):
    fleet: Fleet
    queue: QueueState


class Problem(BaseModel):
    detail: str


ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "No such run"},
    409: {"model": Problem, "description": "The run's status does not allow this"},
}


def create_app(services: Services) -> FastAPI:
    app = FastAPI(title="phasegate orchestrator", version="1",
                  description="Start, inspect and steer phasegate workflow runs.")
    app.state.services = services

    @app.exception_handler(ControlError)
    async def control_error(request: Request, exc: ControlError) -> JSONResponse:
        return JSONResponse({"detail": exc.reason}, status_code=exc.status_code)

    control = services.control

    @app.post("/v1/workflows", status_code=201, response_model=Run,
              responses={200: {"model": Run, "description": "The run with this id existed"},
                         422: {"description": "Unknown workflow or bad input"}})
    async def start(request: StartRequest, response: Response) -> Run:
        run, created = await control.start(request.workflow, request.input, request.id,
                                           classification=request.classification,
                                           region=request.region)
        if not created:
            response.status_code = 200
        return run

    @app.get("/v1/workflows/{workflow_id}", response_model=Run, responses=ERRORS)
    async def get_run(workflow_id: str) -> Run:
        return await (await control.scoped(workflow_id)).views.get_run(workflow_id)

    @app.get("/v1/workflows", response_model=RunPage)
    async def list_runs(
            status: str | None = None, workflow: str | None = None, phase: str | None = None,
            limit: Annotated[int, Query(ge=1, le=500)] = 50,
            cursor: str | None = None) -> RunPage:
        return await control.views.list_runs(status=status, workflow=workflow, phase=phase,
                                             limit=limit, cursor=cursor)

    @app.get("/v1/workflows/{workflow_id}/checkpoints", response_model=CheckpointPage,
             responses=ERRORS)
    async def checkpoints(
            workflow_id: str, include: Annotated[str | None, Query(pattern="^state$")] = None,
            after: Annotated[int, Query(ge=0)] = 0,
            limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
            x_phasegate_role: Annotated[str | None, Header(
                description="The caller's role for the read policy (PHASEGATE_READ_POLICY); "
                            "set by the authenticating proxy in front of this API.")] = None,
    ) -> CheckpointPage:
        if x_phasegate_role is not None and not ROLE_PATTERN.match(x_phasegate_role):
            raise Invalid("X-Phasegate-Role must be 1-64 chars of [A-Za-z0-9_.:-]")
        scoped = await control.scoped(workflow_id)
        return await scoped.views.checkpoints(workflow_id, include_state=include == "state",
                                              after=after, limit=limit, role=x_phasegate_role)

    @app.get("/v1/workflows/{workflow_id}/actions", responses=ERRORS)
    async def actions(workflow_id: str) -> dict[str, Any]:
        scoped = await control.scoped(workflow_id)
        await scoped.views.get_run(workflow_id)
        return {"workflow_id": workflow_id,
                "actions": [a.model_dump(mode="json")
                            for a in await scoped.views.actions(workflow_id)]}

    def action_route(name: str) -> None:
        async def act(workflow_id: str,
                      body: Annotated[ActionRequest | None, Body()] = None) -> ActionResponse:
            scoped = await control.scoped(workflow_id)
            outcome: Outcome = await getattr(scoped, name)(
                workflow_id, body.reason if body else None)
            return ActionResponse(action=outcome.action, run=outcome.run, sent=outcome.sent)

        app.post(f"/v1/workflows/{{workflow_id}}/{name}", response_model=ActionResponse,
                 responses=ERRORS, name=name, summary=f"{name.capitalize()} a run")(act)

    for name in ("cancel", "retry", "restart", "approve", "reject"):
        action_route(name)

    @app.post("/v1/workflows/{workflow_id}/merge", response_model=ActionResponse,
              responses=ERRORS, summary="Supervisor merge: promote a branch's state")
    async def merge(workflow_id: str, request: MergeRequest) -> ActionResponse:
        scoped = await control.scoped(workflow_id)
        outcome = await scoped.merge(workflow_id, request.branch, request.reason)
        return ActionResponse(action=outcome.action, run=outcome.run, sent=outcome.sent)

    @app.get("/v1/workflows/{workflow_id}/branches", responses=ERRORS)
    async def branches(workflow_id: str) -> dict[str, Any]:
        scoped = await control.scoped(workflow_id)
        return {"workflow_id": workflow_id, "forks": await scoped.branches(workflow_id)}

    @app.get("/v1/stalls", response_model=StallReport)
    async def stalls(older_than_s: Annotated[float, Query(ge=0)] = DEFAULT_STALL_S,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> StallReport:
        return await control.views.stalls(older_than_s, limit)

    @app.get("/v1/summary", response_model=Summary)
    async def summary() -> Summary:
        runs, queue = await asyncio.gather(control.views.summary(), queue_state(services))
        return Summary(runs=runs, queue=queue)

    @app.get("/v1/fleet", response_model=FleetReport)
    async def fleet() -> FleetReport:
        snapshot, queue = await asyncio.gather(services.fleet.snapshot(), queue_state(services))
        return FleetReport(fleet=snapshot, queue=queue)

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

    return app


async def queue_state(services: Services) -> QueueState:
    if services.queue is None:
        return QueueState(error="no queue configured (PHASEGATE_QUEUE_URL)")
    try:
        depth = await asyncio.wait_for(services.queue.depth(), READY_TIMEOUT_S)
    except Exception as exc:
        return QueueState(error=f"{type(exc).__name__}: {exc}"[:200])
    return QueueState(visible=depth.visible, inflight=depth.inflight, delayed=depth.delayed)


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
