"""What the HTTP API's routes take and give: request bodies, parameter types (the admitted
caller is one), response bodies, and the error responses the routes declare (orchestrator/api.py
and orchestrator/api_steering.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Depends, HTTPException, Request
from fastapi import Path as Path_
from pydantic import BaseModel, Field, model_validator

from phasegate.orchestrator.auth import Caller
from phasegate.orchestrator.fleet import Fleet
from phasegate.orchestrator.views import LiveWorker, MessageAges, Run, SummaryRow
from phasegate.signals import IDEMPOTENCY_KEY_PATTERN, MAX_KEY_CHARS
from phasegate.storable import UnstorableValue, check_storable
from phasegate.waits import SIGNAL_NAME


class Storable(BaseModel):
    """A request body PostgreSQL can store: no NUL, no lone surrogate, not too deep."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        try:
            check_storable(value, where="body")
        except UnstorableValue as exc:
            raise ValueError(f"{exc.where}: {exc.reason}") from None
        return value


class StartRequest(Storable):
    workflow: str = Field(min_length=1, max_length=200)
    input: Any = None
    id: str | None = Field(default=None, description="Opaque id; a repeat returns the run.")
    classification: Literal["public", "internal", "sensitive", "regulated"] | None = Field(
        default=None, description="Default internal; sensitive and regulated need a region.")
    region: str | None = Field(
        default=None, description="The store (PHASEGATE_STORES) the run lives in; fixed.")


class MergeRequest(Storable):
    branch: str = Field(min_length=1, max_length=26, description="The branch to promote.")
    reason: str | None = Field(default=None, max_length=1000)


class ActionRequest(Storable):
    reason: str | None = Field(default=None, max_length=1000)


class SignalRequest(Storable):
    payload: Any = Field(default=None, description="Any JSON; the next phase's ctx.signal.")
    idempotency_key: str | None = Field(
        default=None, min_length=1, max_length=MAX_KEY_CHARS, pattern=IDEMPOTENCY_KEY_PATTERN,
        description=f"1-{MAX_KEY_CHARS} visible ASCII characters. A repeat with the same key "
                    "changes nothing (also: Idempotency-Key).")


class SignalResponse(BaseModel):
    workflow_id: str
    name: str
    signal_id: int
    delivered: bool = Field(description="It woke the run's wait for this name; false: kept "
                                        "until a wait for its name, or the run's end.")
    duplicate: bool = Field(description="The idempotency key was seen before; nothing changed.")
    sent: bool = Field(description="The woken run's message reached SQS (false: the relay "
                                   "sends it).")


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
    workers: list[LiveWorker] = Field(
        description="Workers that reported within two of their presence intervals, oldest "
                    "first (the console's fleet page); empty: the fleet may be at zero.")
    ages: MessageAges = Field(
        description="How long messages have waited (database time, main chains only), as "
                    "the console's fleet page shows them.")


class Problem(BaseModel):
    detail: str


ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "No such run"},
    409: {"model": Problem, "description": "The run's status does not allow this"},
}
GATE_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "No bearer token, or not a valid one"},
    403: {"model": Problem, "description": "The token's roles do not include the one needed"},
    503: {"model": Problem, "description": "The database (or the token check) is unreachable"},
}
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"model": Problem, "description": "The body exceeds PHASEGATE_API_MAX_BODY_BYTES"},
}

WorkflowId = Annotated[str, Path_(min_length=1, max_length=200)]
SignalName = Annotated[str, Path_(pattern=SIGNAL_NAME.pattern)]


def caller_of(request: Request) -> Caller:
    """The caller the gate admitted. None means the route was reached without the gate:
    refuse (fail closed) rather than act for nobody."""
    caller: Caller | None = request.scope.get("state", {}).get("caller")
    if caller is None:
        raise HTTPException(401, "not authenticated", headers={"WWW-Authenticate": "Bearer"})
    return caller


CallerDep = Annotated[Caller, Depends(caller_of)]
