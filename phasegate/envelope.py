"""Message envelope v1: the one contract every producer and every worker share.

``{"v": 1, "kind": "start|phase|merge|deadline", "workflow_id", "workflow", "seq", "phase",
"branch", "input" (start only), "traceparent"}``. A start message may omit ``seq`` and
``phase``. Workers write the others; ``deadline`` is a race's deadline (seq = the fork's seq,
branch = the forking chain, phase = the merge phase; phasegate/race_deadline.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from phasegate.limits import SQS_MAX_GROUP_ID_CHARS

ENVELOPE_VERSION = 1
MAIN_BRANCH = "main"

# Workflow ids travel unencrypted in SQS group ids and attributes, so they must be opaque:
# a restricted alphabet keeps an e-mail address or a name with spaces out of them.
WORKFLOW_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
BRANCH_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,26}$")
MAX_SEQ = 2**31 - 1  # the largest Postgres integer
MAX_NAME_CHARS = 200  # a workflow's or a phase's name


class Envelope(BaseModel):
    """A parsed phase message. Unknown fields are rejected so typos surface as poison."""

    # Strict: a producer's ``"seq": "3"`` or ``"seq": 3.0`` is a bug to surface, not to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    v: Literal[1]
    kind: Literal["start", "phase", "merge", "deadline"]
    workflow_id: str
    workflow: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    # Postgres stores seq as integer: a bigger one would fail inside the transition.
    seq: int = Field(default=0, ge=0, le=MAX_SEQ)
    phase: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    branch: str = MAIN_BRANCH
    input: Any = None
    traceparent: str | None = Field(default=None, max_length=55)
    # Data residency (docs/concepts/governance.md): non-secret routing hints. ``region`` names
    # the store that holds the run (absent: the default store); ``classification`` is read on a
    # start.
    classification: Literal["public", "internal", "sensitive", "regulated"] | None = None
    region: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9-]{0,31}$")

    @field_validator("v", mode="before")
    @classmethod
    def _version_is_the_integer_1(cls, value: Any) -> Any:
        # Literal[1] alone accepts True and 1.0 (they compare equal to 1).
        if type(value) is not int:
            raise ValueError("v must be the integer 1")
        return value

    @field_validator("workflow_id")
    @classmethod
    def _opaque_id(cls, value: str) -> str:
        if not WORKFLOW_ID_PATTERN.fullmatch(value):
            raise ValueError("workflow_id must be 1-100 chars of [A-Za-z0-9_.:-]")
        return value

    @field_validator("branch")
    @classmethod
    def _branch(cls, value: str) -> str:
        if not BRANCH_PATTERN.fullmatch(value):
            raise ValueError("branch must be 1-26 chars of [A-Za-z0-9_.-]")
        return value

    @model_validator(mode="after")
    def _shape(self) -> Envelope:
        if self.kind != "start" and self.phase is None:
            raise ValueError(f"a {self.kind} message needs a phase")
        if self.kind != "start" and self.input is not None:
            raise ValueError("only a start message carries input")
        if self.classification in ("sensitive", "regulated") and self.region is None:
            raise ValueError(f"a {self.classification} run needs a region")
        return self

    @property
    def group_id(self) -> str:
        return message_group_id(self.workflow_id, self.branch)

    @property
    def dedup_id(self) -> str:
        return dedup_id(self.workflow_id, self.branch, self.seq,
                        deadline=self.kind == "deadline")

    def to_json(self) -> str:
        """The message body: compact JSON, non-ASCII escaped (SQS refuses some code points
        that JSON allows raw). Every body of the same envelope is the same text, whichever
        branch below wrote it (``tests/unit/test_envelope.py``)."""
        if self.input is None:
            # pydantic's own encoder, a third of the time: the same text when it is ASCII
            # without DEL (the one ASCII character json.dumps escapes). An input is left to
            # json.dumps, which writes some floats (1e+16, NaN) differently.
            text = self.model_dump_json(exclude_none=True)
            if text.isascii() and "\x7f" not in text:
                return text
        return json.dumps(self.model_dump(exclude_none=True), separators=(",", ":"))


def message_group_id(workflow_id: str, branch: str = MAIN_BRANCH) -> str:
    group = workflow_id if branch == MAIN_BRANCH else f"{workflow_id}/{branch}"
    assert len(group) <= SQS_MAX_GROUP_ID_CHARS
    return group


# A transition asks for the same message's id several times (the commit's outbox row, the
# message sent, the phase then running it locally): one digest each, not one per ask. Pure,
# so a cache answers exactly what the digest would; bounded by the messages in flight.
@lru_cache(maxsize=4096)
def dedup_id(workflow_id: str, branch: str, seq: int, epoch: int = 0, *,
             deadline: bool = False) -> str:
    """sha256 of ``workflow_id:branch:seq``; a retried run adds its epoch so SQS's 5-minute
    deduplication window does not swallow the message that resumes it, and a race's deadline
    message adds ``:deadline`` (its seq is the forking message's)."""
    key = (f"{workflow_id}:{branch}:{seq}" + (f":{epoch}" if epoch else "")
           + (":deadline" if deadline else ""))
    return hashlib.sha256(key.encode()).hexdigest()


# json.dumps with these options builds an encoder on every call; encoding keeps no state
# between calls, so one is built once.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)


def canonical_json(value: Any) -> str:
    """The one serialisation used for hashing and storing state. Raises on NaN/Infinity and
    on anything JSON cannot represent, so bad state fails at the phase that produced it."""
    return _CANONICAL.encode(value)


def state_hash(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()


def phase_message(workflow_id: str, workflow: str, seq: int, phase: str,
                  branch: str = MAIN_BRANCH, traceparent: str | None = None,
                  kind: Literal["phase", "merge"] = "phase") -> Envelope:
    return Envelope(v=1, kind=kind, workflow_id=workflow_id, workflow=workflow, seq=seq,
                    phase=phase, branch=branch, traceparent=traceparent)


def successor_message(envelope: Envelope, workflow: str, phase: str) -> Envelope:
    """The next phase's message on ``envelope``'s branch: seq + 1, the same run, trace parent
    and branch; no input, no residency hint (``residency.carry`` adds the region).

    Every field but ``seq`` and ``phase`` comes from ``envelope``, validated when it was
    parsed (``workflow`` is the name it was routed by), so when those two are within the
    model's bounds it is copied without running the validators again (about a third of the
    cost: docs/benchmarks-rounds.md, "Python per hop"). Otherwise it is validated in full and fails
    exactly as ``phase_message`` does."""
    seq = envelope.seq + 1
    if seq > MAX_SEQ or len(phase) > MAX_NAME_CHARS or workflow != envelope.workflow:
        return phase_message(envelope.workflow_id, workflow, seq, phase, envelope.branch,
                             envelope.traceparent)
    # A copy is ~3x cheaper than model_construct, which walks every field in Python.
    return envelope.model_copy(update={"kind": "phase", "seq": seq, "phase": phase,
                                       "input": None, "classification": None, "region": None})


def start_message(workflow_id: str, workflow: str, input: Any,
                  traceparent: str | None = None) -> Envelope:
    return Envelope(v=1, kind="start", workflow_id=workflow_id, workflow=workflow, seq=0,
                    input=input, traceparent=traceparent)
