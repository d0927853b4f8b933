"""Hostile input and hostile workflow code: the checks that keep them from looping or killing.

Each check runs before anything is written (a start, an envelope) or before the commit (a
phase's returned state), so a refusal is a defined state: a quarantine row with a reason, or
a run ``failed`` with an error -- never an exception deep in a transaction that would be
retried every visibility timeout. Reasons never echo the value that was refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phasegate.envelope import MAIN_BRANCH, Envelope, canonical_json
from phasegate.queue import Received
from phasegate.steps import LedgerUnavailable
from phasegate.storable import (
    UnstorableValue,
    check_storable,
    check_storable_size,
    plainly_storable,
)
from phasegate.tiers import Grade, Tier, grade
from phasegate.waits import WaitError
from phasegate.worker.deadlines import PhaseDeadlines
from phasegate.workflow import NonRetryableError, Phase, Workflow

if TYPE_CHECKING:
    from phasegate.context import Context

# Crashes of the transition itself (not of a phase) on one message before it is quarantined
# and its run failed. Three: one crash may be a passing fault, the same crash three times on
# three deliveries is the message (or the code it reaches), and retrying it only re-runs the
# phase's side effects. Far below the README's maxReceiveCount (50), so SQS's redrive never
# takes the raw body first.
MAX_TRANSITION_CRASHES = 3


class PhaseTimeout(Exception):
    """A phase ran longer than its timeout; the attempt is cancelled and counts as failed."""


def refused_start(envelope: Envelope, workflow: Workflow) -> tuple[str, str] | None:
    """(code, detail) when a start message must not create its run; None when it may.

    Checked in full before the run is created (``start_and_load``, ``start_keyed``): a start
    quarantined after its row was written would leave a ``running`` run with no message to
    wake it."""
    if envelope.branch != MAIN_BRANCH:
        return "start_branch", "a start message must be on the main branch"
    if envelope.seq != 0:
        return "start_seq", f"a start message must have seq 0 (it has {envelope.seq})"
    if envelope.phase is not None and envelope.phase != workflow.first_phase:
        return "start_phase", (f"a start message may name only the first phase "
                               f"({workflow.first_phase}), not {envelope.phase}")
    try:
        storable(envelope.input, "input")
    except UnstorableValue as exc:
        return "unstorable_input", str(exc)
    return None


def storable(value: Any, where: str) -> str:
    """The canonical JSON of ``value``, or :class:`UnstorableValue` naming where it fails.

    Encoded first, then checked on the text and the value's shape (``plainly_storable``);
    only a value that fails that goes through the full walk, which names the place. The walk
    builds a path for every node: 1.4 ms for a 118 KB state, against 0.75 ms for its encoding
    and 0.34 ms for the walk without paths (``python -m bench.hops``)."""
    try:
        canonical = canonical_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        check_storable(value, where=where)
        # What the walk accepts and json does not (an int too long to write as text).
        raise UnstorableValue(where, f"not JSON ({type(exc).__name__})") from None
    if not plainly_storable(value, canonical):
        check_storable(value, where=where)
    check_storable_size(canonical, where=where)
    return canonical


def group_mismatch(message: Received, envelope: Envelope) -> tuple[str, str] | None:
    """A message whose MessageGroupId is not its run's group: two groups for one run would
    let two of its phases run at once, breaking one-phase-at-a-time."""
    if message.group_id == envelope.group_id:
        return None
    return "group_mismatch", ("MessageGroupId is not the run's group (the workflow_id, or "
                              "workflow_id/branch on a branch)")


def phase_timeout(phase: Phase, default_s: float) -> float | None:
    """Seconds one attempt may take; None: no limit (0 in the setting or the decorator)."""
    limit = default_s if phase.timeout_s is None else phase.timeout_s
    return limit if limit > 0 else None


async def call_phase(phase: Phase, ctx: Context, state: Any, limit_s: float | None,
                     deadlines: PhaseDeadlines | None = None) -> Any:
    """Run one attempt of ``phase``; past ``limit_s`` it is cancelled and
    :class:`PhaseTimeout` (a retryable failure) is raised instead. ``deadlines``: the worker's
    (worker/deadlines.py; default: one for this attempt alone)."""
    if limit_s is None:
        return await phase.fn(ctx, state)
    deadlines = deadlines or PhaseDeadlines()
    limit = deadlines.start(limit_s)
    try:
        result = await phase.fn(ctx, state)
    except BaseException as exc:
        deadlines.end(limit)
        # A TimeoutError of the phase's own is an ordinary failure; so is what a phase raises
        # after swallowing the cancellation of its expired limit.
        if limit.expired and limit.withdraw() and isinstance(exc, asyncio.CancelledError):
            raise PhaseTimeout(f"phase {phase.name} ran longer than {limit_s:g}s") from None
        raise
    deadlines.end(limit)
    if limit.expired:  # expired as it returned, or it swallowed the cancellation
        limit.withdraw()
    return result


@dataclass(frozen=True)
class Failed:
    """A phase attempt that raised: what, and whether the retry budget applies."""

    exc: BaseException
    retryable: bool


async def attempt(phase: Phase, ctx: Context, state: Any, tiers: Sequence[Tier],
                  limit_s: float | None, deadlines: PhaseDeadlines | None = None
                  ) -> tuple[Any, Grade | None] | Failed:
    """One attempt of a phase and its grading (user code, both): the new state and its
    grade, or how it failed. Anything the phase raises is a failure of the phase --
    ``sys.exit()`` and ``KeyboardInterrupt`` included -- except the worker's own cancellation
    and the step ledger's database, which are not the phase's to be charged for."""
    try:
        new_state = await call_phase(phase, ctx, state, limit_s, deadlines)
        return new_state, await grade(tiers, new_state)
    except (NonRetryableError, WaitError) as exc:  # a wrong wait is as wrong on every retry
        return Failed(exc, retryable=False)
    except LedgerUnavailable:
        raise  # our database: the transition hands the message back, budget not charged
    except Exception as exc:  # PhaseTimeout included: the slot is freed, then a retry
        return Failed(exc, retryable=True)
    except asyncio.CancelledError as exc:
        if own_cancellation():
            raise
        return Failed(exc, retryable=False)  # raised by the phase itself
    except BaseException as exc:  # sys.exit(), KeyboardInterrupt: the phase's, not ours
        return Failed(exc, retryable=False)


def own_cancellation() -> bool:
    """True when the running task is being cancelled by the worker (shutdown), not when a
    phase raised CancelledError of its own accord."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
