"""The HTTP API's routes that steer a run: cancel, retry and restart; the review decisions
approve and reject (with idempotency keys); signals; and the supervisor's merge. Each acts
as the caller the gate admitted, so the audit trail names who did it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Body, FastAPI, Header, Response

from phasegate.orchestrator.api_models import (
    BODY_ERRORS,
    ERRORS,
    ActionRequest,
    ActionResponse,
    CallerDep,
    MergeRequest,
    SignalName,
    SignalRequest,
    SignalResponse,
    WorkflowId,
)
from phasegate.orchestrator.control import Control, Outcome
from phasegate.signals import IDEMPOTENCY_KEY_PATTERN, MAX_KEY_CHARS


def add_steering_routes(app: FastAPI, control: Control) -> None:
    """Register the steering routes on ``app`` in the order the OpenAPI document lists them."""
    for name in ("cancel", "retry", "restart"):
        _action_route(app, control, name)
    for name in ("approve", "reject"):
        _decision_route(app, control, name)
    _signal_route(app, control)
    _merge_route(app, control)


def _action_route(app: FastAPI, control: Control, name: str) -> None:
    async def act(workflow_id: WorkflowId, caller: CallerDep,
                  body: Annotated[ActionRequest | None, Body()] = None) -> ActionResponse:
        scoped = await control.acting_as(caller.name).scoped(workflow_id)
        outcome: Outcome = await getattr(scoped, name)(
            workflow_id, body.reason if body else None)
        return ActionResponse(action=outcome.action, run=outcome.run, sent=outcome.sent)

    app.post(f"/v1/workflows/{{workflow_id}}/{name}", response_model=ActionResponse,
             responses={**ERRORS, **BODY_ERRORS}, name=name,
             summary=f"{name.capitalize()} a run")(act)


def _decision_route(app: FastAPI, control: Control, name: str) -> None:
    async def decide(workflow_id: WorkflowId, caller: CallerDep, response: Response,
                     body: Annotated[ActionRequest | None, Body()] = None,
                     idempotency_key: Annotated[str | None, Header(
                         pattern=IDEMPOTENCY_KEY_PATTERN,
                         description=f"1-{MAX_KEY_CHARS} visible ASCII characters. A "
                                     "retry with the same key gets the first answer (200, "
                                     "the same body, header Idempotent-Replayed: true) and "
                                     "changes nothing.")] = None) -> ActionResponse:
        """A run awaiting review: ``approve`` continues it, ``reject`` re-runs the phase
        under review. Without ``Idempotency-Key``, a repeat is a 409 (the run is no
        longer awaiting review)."""
        scoped = await control.acting_as(caller.name).scoped(workflow_id)
        outcome: Outcome = await getattr(scoped, name)(
            workflow_id, body.reason if body else None, idempotency_key=idempotency_key)
        if outcome.replayed:
            response.headers["Idempotent-Replayed"] = "true"
        return ActionResponse(action=outcome.action, run=outcome.run, sent=outcome.sent)

    app.post(f"/v1/workflows/{{workflow_id}}/{name}", response_model=ActionResponse,
             responses={**ERRORS, **BODY_ERRORS, 422: {
                 "description": "A bad idempotency key or body"}}, name=name,
             summary=f"{name.capitalize()} a run")(decide)


def _signal_route(app: FastAPI, control: Control) -> None:
    @app.post("/v1/workflows/{workflow_id}/signals/{name}", response_model=SignalResponse,
              responses={**ERRORS, **BODY_ERRORS, 422: {
                  "description": "A bad signal name, idempotency key or payload"}},
              summary="Send a signal to a run")
    async def signal(workflow_id: WorkflowId, name: SignalName, caller: CallerDep,
                     body: Annotated[SignalRequest | None, Body()] = None,
                     idempotency_key: Annotated[str | None, Header(
                         min_length=1, max_length=MAX_KEY_CHARS,
                         pattern=IDEMPOTENCY_KEY_PATTERN,
                         description=f"1-{MAX_KEY_CHARS} visible ASCII characters. A "
                                     "repeat with the same key changes nothing (also: the "
                                     "body's idempotency_key, which wins).")] = None,
                     ) -> SignalResponse:
        """Wakes the run if it waits for ``name`` (``ctx.wait_for_signal``); otherwise the
        signal is kept until a wait for its name, or until the run ends. 404: no such run;
        409: the run has ended."""
        scoped = await control.acting_as(caller.name).scoped(workflow_id)
        request = body or SignalRequest()
        result = await scoped.signal(workflow_id, name, request.payload,
                                     request.idempotency_key or idempotency_key)
        return SignalResponse(workflow_id=workflow_id, name=name, signal_id=result.signal_id,
                              delivered=result.delivered, duplicate=result.duplicate,
                              sent=result.sent)


def _merge_route(app: FastAPI, control: Control) -> None:
    @app.post("/v1/workflows/{workflow_id}/merge", response_model=ActionResponse,
              responses={**ERRORS, **BODY_ERRORS},
              summary="Supervisor merge: promote a branch's state")
    async def merge(workflow_id: WorkflowId, request: MergeRequest,
                    caller: CallerDep) -> ActionResponse:
        scoped = await control.acting_as(caller.name).scoped(workflow_id)
        outcome = await scoped.merge(workflow_id, request.branch, request.reason)
        return ActionResponse(action=outcome.action, run=outcome.run, sent=outcome.sent)
