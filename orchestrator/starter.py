"""Start a workflow run: the run row and its first message are written in one statement
(through the outbox), then the message is sent. A crash after the commit loses nothing: the
relay sends the start message."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phasegate.concurrency import ConcurrencyKeyError, key_for
from phasegate.envelope import WORKFLOW_ID_PATTERN, canonical_json, start_message
from phasegate.queue import Outgoing, Queue
from phasegate.residency import ResidencyError, residency
from phasegate.storable import UnstorableValue, check_storable, check_storable_size
from phasegate.store import Store
from phasegate.workflow import Registry, Workflow


class StartError(ValueError):
    """The start request is wrong (unknown workflow, bad id, input not JSON)."""


@dataclass(frozen=True)
class Started:
    workflow_id: str
    created: bool
    sent: bool
    # The run as created (control.sql get_run's columns); None when the id existed.
    run: dict[str, Any] | None = None


def new_workflow_id() -> str:
    """Opaque, random, safe to put in an SQS group id."""
    return f"wf_{secrets.token_hex(12)}"


def resolve_workflow(registry: Registry | None, name: str) -> Workflow | None:
    return registry.get(name) if registry is not None else None


async def start_workflow(store: Store, queue: Queue, *, workflow: Workflow, input: Any,
                         workflow_id: str | None = None, classification: str | None = None,
                         region: str | None = None,
                         mark_sent: Callable[[int], None] | None = None) -> Started:
    """Create the run (idempotent on ``workflow_id``) and send its start message.

    ``classification`` (default internal) and ``region`` (required for sensitive and
    regulated runs) fix the store the run lives in (docs/concepts/governance.md); a region with no
    configured store is refused before anything is written.

    ``mark_sent``: takes the sent message's outbox row to mark later (the API's batch of
    marks, ``MicroBatcher.post``), so the caller does not wait for the mark's round trip;
    without it the row is marked before this returns. A mark that never happens only lets
    the relay send the message again after its grace (``PHASEGATE_RELAY_AFTER_S``), under
    the same deduplication id, as after a crash between the send and the mark."""
    try:
        wanted = residency(classification, region)
    except ResidencyError as exc:
        raise StartError(str(exc)) from None
    workflow_id = workflow_id or new_workflow_id()
    if not WORKFLOW_ID_PATTERN.fullmatch(workflow_id):
        raise StartError("workflow id must be 1-100 chars of [A-Za-z0-9_.:-] and opaque "
                         "(SQS does not encrypt ids)")
    try:
        # What jsonb cannot hold is refused here, before the run row (phasegate/storable.py).
        check_storable(input, where="input")
        check_storable_size(canonical_json(input), where="input")
    except UnstorableValue as exc:
        raise StartError(f"input cannot be stored: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise StartError(f"input is not JSON: {exc}") from None
    if workflow.concurrency_key is not None:  # the worker computes it again at the start
        try:
            key_for(workflow, input)
        except ConcurrencyKeyError as exc:
            raise StartError(str(exc)) from None
    # The run row holds the input; the message only wakes a worker, so it carries none.
    # Classification and region are routing hints, not data: the worker finds the store by them.
    message = start_message(workflow_id, workflow.name, None).model_copy(
        update={"classification": wanted.classification, "region": wanted.region})
    try:
        created = await store.start_run(
            workflow_id=workflow_id, workflow=workflow.name,
            schema_version=workflow.schema_version, input=input,
            first_phase=workflow.first_phase, message=message)
    except ResidencyError as exc:
        raise StartError(str(exc)) from None
    if created is None:
        return Started(workflow_id, created=False, sent=False)
    try:
        await queue.send([Outgoing(message.to_json(), message.group_id, message.dedup_id)])
    except Exception:  # the relay will send it
        return Started(workflow_id, created=True, sent=False, run=created.run)
    if mark_sent is not None:
        mark_sent(created.outbox_id)
    else:
        await store.mark_sent([created.outbox_id])
    return Started(workflow_id, created=True, sent=True, run=created.run)
