"""Per-key concurrency and rate: ``Workflow(..., concurrency_key=fn, max_concurrency=N,
rate=(M, seconds))``.

At most N runs with the same (workflow, key) are past their start at once; later starts wait
in Postgres as ``queued`` and are admitted in start order as runs end. Every decision is made
inside the transaction that takes or frees a slot (migration 0011): a keyed start calls
``phasegate_take_slot`` (through ``phasegate_start_keyed_and_load``, which first creates the
run a producer only enqueued and then loads an admitted run: one round trip, migration 0034); a
run's end, whatever statement ends it (a phase commit, a failed attempt, a halt, a cancel),
fires the ``workflow_runs_free_slot`` trigger, which admits the next queued run and puts its
start message in the outbox. The worker that freed the slot sends that message
(``admitted_by``); the relay sends it if that worker dies first.

A rate limit (migration 0014) is decided in the same function: at most M admissions of the
key in any window of ``seconds``; when the rate is spent, the head of the queue gets a start
message due when the window allows (a timer row the relay sends), and its worker admits again.

A workflow without a key pays nothing: its runs have no key, so the trigger's WHEN clause
skips them, and the worker makes no extra query.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phasegate.envelope import MAIN_BRANCH, Envelope
from phasegate.sql import queries
from phasegate.store import OutboxRow, RunPosition, Slot, Store

if TYPE_CHECKING:
    from phasegate.workflow import Workflow

# Settlement outcomes after which a keyed run may have freed its slot (completed, failed, or
# found cancelled): its worker then sends what the trigger admitted.
FREES_SLOT = frozenset({"completed", "failed", "stale"})
# Long enough for a tenant id or a composite key, short enough to index.
MAX_KEY_CHARS = 200
# A rate window longer than a day is a schedule's job; the bound also catches milliseconds
# written as seconds.
MAX_RATE_WINDOW_S = 86400.0


class ConcurrencyKeyError(ValueError):
    """``concurrency_key(input)`` raised or returned something that is not a usable key.
    The message never echoes the input or the returned value."""


@dataclass(frozen=True)
class Refused:
    reason: str


def key_for(workflow: Workflow, input: Any) -> str:
    """The run's key, from the workflow's ``concurrency_key`` function and the start input."""
    fn = workflow.concurrency_key
    assert fn is not None
    try:
        key = fn(input)
    except Exception as exc:  # user code: any error refuses the start, none escapes
        raise ConcurrencyKeyError(
            f"concurrency_key of {workflow.name} raised {type(exc).__name__}") from None
    if not isinstance(key, str):
        raise ConcurrencyKeyError(f"concurrency_key of {workflow.name} returned "
                                  f"{type(key).__name__}, not str")
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        raise ConcurrencyKeyError(f"concurrency_key of {workflow.name} returned a key of "
                                  f"{len(key)} chars (1-{MAX_KEY_CHARS})")
    return key


def check_rate(rate: Any) -> tuple[int, float] | None:
    """``rate=(N, seconds)``: N an int >= 1, seconds a number in (0, MAX_RATE_WINDOW_S]."""
    if rate is None:
        return None
    if not isinstance(rate, tuple | list) or len(rate) != 2:
        raise ValueError("rate must be a pair (N, seconds), e.g. rate=(10, 60.0)")
    count, seconds = rate
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"rate's N must be an int >= 1, not {count!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
            or not math.isfinite(seconds) or not 0 < seconds <= MAX_RATE_WINDOW_S:
        raise ValueError(f"rate's seconds must be a number in (0, {MAX_RATE_WINDOW_S:.0f}], "
                         f"not {seconds!r}")
    return count, float(seconds)


def slot_for(workflow: Workflow, envelope: Envelope, key: str | None) -> Slot:
    """What a start of ``workflow``'s run (``envelope``: its start message) asks of its key,
    the worker's or the API's: the limits, and the admission message that wakes the run if it
    has to wait. ``key`` None: the key the run already has."""
    rate, window_s = workflow.rate if workflow.rate is not None else (None, None)
    admit = admission_message(envelope)
    return Slot(key=key, limit=workflow.max_concurrency,
                dedup_id=admission_dedup_id(envelope.workflow_id), group_id=admit.group_id,
                body=admit.to_json(), rate=rate, window_s=window_s)


# What a start without a key answers for a run that has none yet (migration 0034).
UNKEYED = "unkeyed"


def admission_message(envelope: Envelope) -> Envelope:
    """The start message that wakes a queued run once admitted: the run row holds the input,
    so it carries none (and stays small however large the input)."""
    return envelope.model_copy(update={"input": None, "phase": None})


def admission_dedup_id(workflow_id: str) -> str:
    """Not the start's own deduplication id: SQS would drop a second message with that id
    for five minutes, and a run is often admitted sooner than that."""
    return hashlib.sha256(f"{workflow_id}:{MAIN_BRANCH}:0:admitted".encode()).hexdigest()


async def start(store: Store, envelope: Envelope, workflow: Workflow
                ) -> tuple[str, RunPosition | None] | Refused:
    """A keyed workflow's start message: create the run if needed, then take a slot or queue,
    and load the run unless it was queued. Returns the run's status after the decision
    (``queued``, ``pending``, or what it already was for a redelivered start; ``missing``:
    no run) with the position the load gave (None: queued, or no run), or why the start is
    refused.

    The key is computed before anything is written when the message carries the input. A
    message without it (the API's start, an admission, a rate wake-up) names a run that took
    its key when it was created or first started: the statement uses that key. Only a run
    without one (created by an API of the previous release) has its input read to compute it,
    one more round trip and the statement again."""
    async def take(key: str | None) -> tuple[str | None, RunPosition | None]:
        # The run created if a producer only enqueued it, its slot taken and, once admitted,
        # the run loaded: one round trip.
        return await store.start_keyed(envelope, workflow.schema_version,
                                       workflow.first_phase, slot_for(workflow, envelope, key))

    input = envelope.input
    if input is None:
        status, position = await take(None)
        if status != UNKEYED:
            return status or "missing", position
        row = await store.pool.fetchval(queries("flow.sql")["run_input"], envelope.workflow_id)
        if row is not None:
            input = json.loads(row)
    try:
        key = key_for(workflow, input)
    except ConcurrencyKeyError as exc:
        return Refused(str(exc))
    status, position = await take(key)
    return status or "missing", position


async def admitted_by(store: Store, workflow_id: str) -> list[OutboxRow]:
    """Unsent start messages of the runs this run's end (or start) admitted."""
    rows = await store.pool.fetch(queries("flow.sql")["admitted_by"], workflow_id)
    return [OutboxRow(**dict(row)) for row in rows]
