"""Start a workflow run: the run row and its first message are written in one statement
(through the outbox), then the message is sent. A crash after the commit loses nothing: the
relay sends the start message. A workflow with a concurrency key takes its slot in the same
statement: a run queued behind its key gets no start message until its admission writes one."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from phasegate.concurrency import ConcurrencyKeyError, admitted_by, key_for, slot_for
from phasegate.envelope import WORKFLOW_ID_PATTERN, Envelope, canonical_json, start_message
from phasegate.queue import Outgoing, Queue
from phasegate.residency import ResidencyError, residency
from phasegate.storable import UnstorableValue, check_storable, check_storable_size
from phasegate.store import Store
from phasegate.workflow import Registry, Workflow

log = structlog.get_logger("phasegate.starter")


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
    key = None
    if workflow.concurrency_key is not None:
        try:
            key = key_for(workflow, input)
        except ConcurrencyKeyError as exc:
            raise StartError(str(exc)) from None
    # The run row holds the input; the message only wakes a worker, so it carries none.
    # Classification and region are routing hints, not data: the worker finds the store by them.
    message = start_message(workflow_id, workflow.name, None).model_copy(
        update={"classification": wanted.classification, "region": wanted.region})
    try:
        if key is None:
            created = await store.start_run(
                workflow_id=workflow_id, workflow=workflow.name,
                schema_version=workflow.schema_version, input=input,
                first_phase=workflow.first_phase, message=message)
        else:  # its slot taken in the same statement: queued, or admitted with its message
            created = await store.start_keyed_run(
                workflow_id=workflow_id, workflow=workflow.name,
                schema_version=workflow.schema_version, input=input,
                first_phase=workflow.first_phase, message=message,
                slot=slot_for(workflow, message, key))
    except ResidencyError as exc:
        raise StartError(str(exc)) from None
    if created is None:
        return Started(workflow_id, created=False, sent=False)
    sent = False
    if created.outbox_id is not None:  # None: queued, its admission writes its start message
        sent = await _send_start(store, queue, message, created.outbox_id, mark_sent)
    if workflow.rate is not None:  # a start may admit runs queued before it, as a worker's
        await _send_admitted(store, queue, workflow_id, mark_sent)
    return Started(workflow_id, created=True, sent=sent, run=created.run)


async def _send_start(store: Store, queue: Queue, message: Envelope, outbox_id: int,
                      mark_sent: Callable[[int], None] | None) -> bool:
    """The start message, then its outbox row marked; False when the send failed (the relay
    sends it)."""
    try:
        await queue.send([Outgoing(message.to_json(), message.group_id, message.dedup_id)])
    except Exception:
        return False
    if mark_sent is not None:
        mark_sent(outbox_id)
    else:
        await store.mark_sent([outbox_id])
    return True


async def _send_admitted(store: Store, queue: Queue, workflow_id: str,
                         mark_sent: Callable[[int], None] | None) -> None:
    """The start messages of runs this start admitted (a rate window that opened again):
    sent now, as a worker sends them after its start; whatever fails, the relay sends."""
    rows = await admitted_by(store, workflow_id)
    if not rows:
        return
    try:
        await queue.send([Outgoing(row.body, row.group_id, row.dedup_id) for row in rows])
    except Exception as exc:
        log.warning("admitted_send_failed_relay_will_send", error=type(exc).__name__)
        return
    ids = [row.outbox_id for row in rows]
    if mark_sent is not None:
        for outbox_id in ids:
            mark_sent(outbox_id)
    else:
        await store.mark_sent(ids)
