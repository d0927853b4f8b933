"""Poison messages of every kind the worker must quarantine (DLQ + a row with a reason).

Each body carries a unique marker in its payload so the checker can prove the quarantine
reason holds no payload data. Kinds that need a live run (``seq_ahead``,
``workflow_mismatch``) are sent into that run's message group, so I5 also proves the group
continued past the poison.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

# The code the worker's quarantine reason must start with, per kind.
EXPECTED_CODE = {
    "not_json": "not_json", "invalid_envelope": "invalid_envelope",
    "bad_workflow_id": "invalid_envelope", "extra_field": "invalid_envelope",
    "unknown_workflow": "unknown_workflow", "unknown_phase": "unknown_phase",
    "oversized": "oversized", "no_run": "no_run", "seq_ahead": "seq_ahead",
    "workflow_mismatch": "workflow_mismatch",
}


@dataclass(frozen=True)
class PoisonMessage:
    kind: str
    body: str
    group_id: str
    marker: str
    live_workflow_id: str | None = None  # the run whose group must continue


def make_poison(kind: str, *, live_workflow_id: str, max_message_bytes: int) -> PoisonMessage:
    marker = f"SECRETPAYLOAD{secrets.token_hex(6)}"
    ghost = f"ghost_{secrets.token_hex(8)}"
    group = ghost
    live: str | None = None
    body: dict[str, object] | str
    if kind == "not_json":
        body = f"{{not json {marker}"
    elif kind == "invalid_envelope":
        body = {"v": 1, "kind": "phase", "workflow_id": ghost, "seq": "x", "note": marker}
    elif kind == "bad_workflow_id":
        body = {"v": 1, "kind": "start", "workflow_id": f"{marker} jane@example.com",
                "workflow": "chaos"}
    elif kind == "extra_field":
        body = {"v": 1, "kind": "start", "workflow_id": ghost, "workflow": "chaos",
                "secret": marker}
    elif kind == "unknown_workflow":
        body = {"v": 1, "kind": "start", "workflow_id": ghost, "workflow": f"nope-{marker}"}
    elif kind == "unknown_phase":
        body = {"v": 1, "kind": "phase", "workflow_id": ghost, "workflow": "chaos", "seq": 1,
                "phase": f"nope-{marker}"}
    elif kind == "oversized":
        body = {"v": 1, "kind": "start", "workflow_id": ghost, "workflow": "chaos",
                "input": marker * (max_message_bytes // len(marker) + 2)}
    elif kind == "no_run":
        body = {"v": 1, "kind": "phase", "workflow_id": ghost, "workflow": "chaos", "seq": 1,
                "phase": "fetch"}
    elif kind == "seq_ahead":
        body = {"v": 1, "kind": "phase", "workflow_id": live_workflow_id, "workflow": "chaos",
                "seq": 1000, "phase": "publish"}
        group = live = live_workflow_id
    elif kind == "workflow_mismatch":
        body = {"v": 1, "kind": "phase", "workflow_id": live_workflow_id,
                "workflow": "chaos-other", "seq": 1, "phase": "only"}
        group = live = live_workflow_id
    else:
        raise ValueError(f"unknown poison kind {kind}")
    text = body if isinstance(body, str) else json.dumps(body)
    if kind in ("no_run", "unknown_phase", "workflow_mismatch", "seq_ahead"):
        # These parse, so the marker rides in a field the envelope allows (the reason must
        # still not echo it).
        text = text[:-1] + f', "traceparent": "{marker[:40]}"}}'
    return PoisonMessage(kind=kind, body=text, group_id=group, marker=marker,
                         live_workflow_id=live)
