"""Step 1 of the transition: parse a received message into an envelope and its workflow, or
name why it is poison (worker/transition.py quarantines it through worker/poison.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from phasegate import residency
from phasegate.envelope import WORKFLOW_ID_PATTERN, Envelope
from phasegate.queue import Received
from phasegate.store import Store
from phasegate.worker.guards import group_mismatch, refused_start
from phasegate.workflow import Registry, Workflow


@dataclass(frozen=True)
class Poison:
    code: str
    detail: str
    workflow_id: str | None = None

    @property
    def reason(self) -> str:
        return f"{self.code}: {self.detail}"


def parse(message: Received, *, max_message_bytes: int, registry: Registry,
          store: Store, sent: Callable[[str], Envelope | None] | None = None
          ) -> tuple[Envelope, Workflow] | Poison:
    """The envelope and its workflow, or why the message is poison (quarantined before any
    row is written anywhere). ``sent``: the envelope this worker encoded as a body, if it
    did (``OwnSuccessors.envelope_sent``); the rest of the checks still run."""
    size = len(message.body.encode())
    if size > max_message_bytes:
        return Poison("oversized", f"{size} bytes > limit {max_message_bytes}")
    envelope = sent(message.body) if sent is not None else None
    if envelope is None:
        decoded = _decode(message.body)
        if isinstance(decoded, Poison):
            return decoded
        envelope = decoded
    workflow = registry.get(envelope.workflow)
    if workflow is None:
        return Poison("unknown_workflow",
                      f"no loaded workflow has that name (loaded: {registry.names()})",
                      envelope.workflow_id)
    if envelope.phase is not None and workflow.get_phase(envelope.phase) is None:
        return Poison("unknown_phase", f"workflow {workflow.name} has no such phase "
                      f"(phases: {[p.name for p in workflow.phases]})", envelope.workflow_id)
    unroutable = residency.unroutable(store, envelope)
    if unroutable is not None:  # refused before anything is written anywhere
        return Poison("unknown_region", unroutable, envelope.workflow_id)
    refused = group_mismatch(message, envelope) or (
        refused_start(envelope, workflow) if envelope.kind == "start" else None)
    if refused is not None:  # before any row is written: nothing is left `running`
        return Poison(*refused, envelope.workflow_id)
    return envelope, workflow


def _decode(body: str) -> Envelope | Poison:
    try:
        raw = json.loads(body)
    except ValueError:
        return Poison("not_json", "body is not valid JSON")
    except RecursionError:  # the parser's own limit: deeper than anything we store
        return Poison("too_deep", "body nests JSON deeper than the parser allows")
    try:
        return Envelope.model_validate(raw)
    except ValidationError as exc:
        # Field names and error types only: pydantic's input echo may hold payload data.
        # An unknown field's name is the producer's text: named only as "<unknown>".
        fields = sorted({str(e["loc"][0]) if e["loc"] and e["loc"][0] in Envelope.model_fields
                         else "<unknown>" if e["loc"] else "<root>" for e in exc.errors()})
        kinds = sorted({e["type"] for e in exc.errors()})
        wid = raw.get("workflow_id") if isinstance(raw, dict) else None
        return Poison("invalid_envelope", f"fields {fields} failed {kinds}",
                      wid if isinstance(wid, str) and WORKFLOW_ID_PATTERN.fullmatch(wid)
                      else None)
