"""The door a phase enters by: re-run or not, which attempt, reviews, the staleness check.

Only workflows with tiers or a version fetcher pay for this (one more query per phase). The
checkpoint at ``seq - 1`` and the operator's decision for ``seq`` say what runs:

- the checkpoint ended in a below-tier ``retry``, or the operator REJECTED it: the phase that
  wrote it runs again, from that phase's input (the checkpoint before its first attempt, or
  the run's input), with ``ctx.tier_attempt`` counting its attempts;
- the operator APPROVED a below-tier result of the last phase: the run completes;
- otherwise the message's phase runs from the checkpoint's state -- after a staleness check
  when the checkpoint is older than the configured age or an operator just decided a review
  (an approved staleness review is not checked again: its envelope takes the new versions).

Decisions are the signals ``phasegate.approve``/``phasegate.reject`` delivered to this seq under
the run's current epoch (phasegate/signals.py ``send_decision``, written with the message that
resumes the run); a decision of the previous release is read from ``control_actions``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from phasegate import staleness
from phasegate.records import record
from phasegate.sql import queries
from phasegate.versions import Corrupt, NeedsRestart, load_verified

if TYPE_CHECKING:
    import asyncpg

    from phasegate.store import RunPosition, Store
    from phasegate.workflow import Workflow


@record
class Door:
    """How the phase at this seq runs."""

    phase: str | None = None  # the phase to run; None: the one the message names
    rerun: bool = False
    state: Any = None  # a re-run's input (replaces the checkpoint's state)
    rerun_of: int | None = None
    tier_attempt: int = 1
    resources: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Halt:
    """Stop the run at its door without running a phase."""

    status: str
    reason: str | None
    review: dict[str, Any] | None = None


async def enter(store: Store, workflow: Workflow, position: RunPosition, branch: str,
                stale_after_s: float) -> Door | Halt:
    # Branches (phasegate/branches.py) run without reviews, re-runs or staleness checks.
    if not workflow.uses_room or position.next_seq == position.base_seq or branch != "main":
        return Door()
    seq = position.next_seq
    row = await store.pool.fetchrow(queries()["room_entry"], position.workflow_id, branch, seq)
    if row is None or row["door_phase"] is None:
        return Door()
    decision, outcome = row["decision"], row["door_outcome"]
    review = json.loads(row["review"]) if row["review"] else {}
    if decision == "approve" and outcome == "review" and _is_last(workflow, row["door_phase"]):
        return Halt("completed", None)
    if outcome == "retry" or decision == "reject":
        return await rerun(store.pool, workflow, position, branch, row)
    resources = staleness.parse_envelope(row["resource_versions"])
    if decision == "approve" and review.get("kind") == "stale" and review.get("seq") == seq:
        return Door(resources=staleness.approved(resources, review))
    due = decision is not None or (row["age_s"] is not None and row["age_s"] >= stale_after_s)
    if workflow.version_fetchers and resources and due:
        stale = await staleness.check(workflow, resources)
        if stale:
            reason, record = staleness.review_for(stale, seq, position.current_phase)
            return Halt("awaiting_review", reason, record)
    return Door(resources=resources)


async def rerun(pool: asyncpg.Pool, workflow: Workflow, position: RunPosition, branch: str,
                row: Any) -> Door | Halt:
    """The door's phase again, from the input of its first attempt."""
    phase = row["door_phase"]
    if workflow.get_phase(phase) is None:
        return Halt("needs_restart", f"rerun: phase {phase} is not in the loaded code")
    first = row["door_rerun_of"] if row["door_rerun_of"] is not None else position.next_seq - 1
    attempt = int(row["door_attempts"]) + 1
    if first <= position.base_seq:
        return Door(phase, True, json.loads(position.input_json or "null"), first, attempt)
    cp = await pool.fetchrow(queries()["room_checkpoint"], position.workflow_id, branch,
                             first - 1)
    if cp is None:
        return Halt("failed", f"checkpoint_missing: no phase checkpoint at seq {first - 1}")
    try:
        state = await load_verified(workflow, first - 1, cp["state"], cp["state_hash"],
                                    cp["schema_version"])
    except Corrupt as exc:
        return Halt("failed", str(exc))
    except NeedsRestart as exc:
        return Halt("needs_restart", str(exc))
    return Door(phase, True, state, first, attempt,
                staleness.parse_envelope(cp["resource_versions"]))


def _is_last(workflow: Workflow, phase: str) -> bool:
    return workflow.get_phase(phase) is not None and workflow.next_phase(phase) is None


async def settle(store: Store, position: RunPosition, halt: Halt) -> bool:
    """Write a Halt: the run's status, its error line and review record."""
    return await store.pool.fetchval(
        queries()["room_settle_run"], position.workflow_id, position.next_seq, halt.status,
        halt.reason, json.dumps(halt.review) if halt.review else None) is not None
