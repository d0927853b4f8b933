"""Redaction: what phasegate writes about a failure or a poison message, without the data.

Workflow state, start inputs and step outputs never reach logs, span attributes, metric
labels, the run's ``error`` column, quarantine reasons or DLQ bodies written by phasegate:

- an exception raised by user code is described by its type, a fingerprint of its message
  (sha256 prefix + length, so equal errors group) and its frames (file, line, function) --
  its message and locals may hold state. phasegate's own exceptions (whose messages it
  writes itself, with no data in them) keep their message;
- a quarantined message goes to the DLQ as an envelope whose recognised, well-formed routing
  fields (``v``, ``kind``, ``workflow_id``, ``workflow``, ``seq``, ...) are kept and every other
  value -- ``input`` above all, unknown fields, malformed ids -- is replaced by
  ``{"sha256": ..., "bytes": ...}``; a body that is not a JSON object is not forwarded at all:
  the DLQ gets ``{"phasegate_quarantined": {"body_sha256", "body_bytes", "reason"}}``.
"""

from __future__ import annotations

import hashlib
import json
import re
import traceback
from collections.abc import MutableMapping
from typing import Any

from phasegate.workflow import NonRetryableError

ERROR_TEXT_LIMIT = 500
MAX_FRAMES = 30
# Envelope fields that route a message; kept in a DLQ body when they are well-formed.
ROUTING_FIELDS = ("v", "kind", "workflow_id", "workflow", "seq", "phase", "branch",
                  "traceparent", "classification", "region")
_SAFE_TEXT = re.compile(r"^[A-Za-z0-9_.:/-]{0,200}$")
_OWN_MODULES = ("phasegate.",)


def digest(text: str) -> dict[str, Any]:
    raw = text.encode("utf-8", "surrogatepass")  # a lone surrogate from a parsed key
    return {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}


def is_own(exc: BaseException) -> bool:
    """An exception phasegate raised with a message it composed (no payload data in it)."""
    kind = type(exc)
    return kind.__module__.startswith(_OWN_MODULES) and kind is not NonRetryableError


def error_text(exc: BaseException) -> str:
    """One line for the run's ``error`` column and for logs."""
    name = type(exc).__name__
    message = str(exc)
    if is_own(exc):
        return f"{name}: {message[:ERROR_TEXT_LIMIT]}"
    if not message:
        return name
    fingerprint = hashlib.sha256(message.encode()).hexdigest()[:12]
    return f"{name} (message withheld: {len(message)} chars, sha256 {fingerprint})"


def frames(exc: BaseException) -> list[str]:
    """Where it was raised: ``file:line in function`` per frame, no source text, no locals."""
    summary = traceback.extract_tb(exc.__traceback__, limit=MAX_FRAMES)
    return [f"{f.filename}:{f.lineno} in {f.name}" for f in summary]


def describe(exc: BaseException) -> dict[str, Any]:
    """The log fields for an exception (use instead of ``exc_info=``)."""
    return {"error": error_text(exc), "error_type": type(exc).__name__,
            "traceback": frames(exc)}


def redact_exc_info(_logger: Any, _method: str,
                    event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: an ``exc_info`` anywhere becomes ``describe()``'s fields, so no
    renderer ever prints an exception message or a frame's locals."""
    exc_info = event_dict.pop("exc_info", None)
    if exc_info is None or exc_info is False:
        return event_dict
    exc: BaseException | None
    if isinstance(exc_info, BaseException):
        exc = exc_info
    elif isinstance(exc_info, tuple):
        exc = exc_info[1]
    else:
        import sys

        exc = sys.exc_info()[1]
    if exc is not None:
        for key, value in describe(exc).items():
            event_dict.setdefault(key, value)
    return event_dict


def _safe_value(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and bool(_SAFE_TEXT.fullmatch(value))


def dlq_body(body: str, reason_code: str) -> str:
    """What phasegate sends to the DLQ for a quarantined message (see the module doc)."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's limit
        raw = None
    if not isinstance(raw, dict):
        return json.dumps({"phasegate_quarantined": {
            "body_sha256": digest(body)["sha256"], "body_bytes": digest(body)["bytes"],
            "reason": reason_code}}, separators=(",", ":"))
    redacted: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ROUTING_FIELDS and _safe_value(value):
            redacted[key] = value
        else:
            name = key if key in ROUTING_FIELDS or key == "input" else "_field"
            text = json.dumps(value, sort_keys=True, separators=(",", ":"))
            if name == "_field":
                redacted.setdefault("_redacted_fields", []).append(digest(key + ":" + text))
            else:
                redacted[name] = digest(text)
    redacted["phasegate_quarantined"] = {"reason": reason_code, "body_bytes": len(body.encode())}
    return json.dumps(redacted, separators=(",", ":"))
