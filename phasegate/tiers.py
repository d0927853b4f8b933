"""Progress tiers: how far a run really got, and what to do when a phase falls short.

A workflow declares ordered tiers, each with a grader ``async (state) -> bool``::

    Workflow("agent", tiers=[("target_found", found), ("verified", verified)])

After every phase the graders run in order on the phase's new state; the run's tier is the
highest CONSECUTIVE passing one (1-based; 0 when the first fails), stored with its label on
the checkpoint and on the run. A phase may expect a tier and declare what happens below it:

- ``below_tier="retry"``: run the phase again from the same input, up to ``max_tier_retries``
  more times; ``ctx.tier_attempt`` (1, 2, ...) lets it change strategy. Every attempt commits
  its own checkpoint (outcome ``retry``), so each attempt's steps have their own keys. When
  the retries are spent, the run is escalated;
- ``below_tier="escalate"``: commit the result and stop at ``awaiting_review``; ``approve``
  continues with it, ``reject`` runs the phase again from its input;
- ``below_tier="advance"``: record the tier and go on.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from phasegate.records import record

if TYPE_CHECKING:
    from phasegate.workflow import Phase, Workflow

Grader = Callable[[Any], "Awaitable[bool] | bool"]
BelowTier = Literal["retry", "escalate", "advance"]
BELOW_TIER: tuple[str, ...] = ("retry", "escalate", "advance")
Action = Literal["advance", "retry", "escalate"]


class TierDefinitionError(ValueError):
    """Tiers or a phase's tier policy were declared wrongly."""


@dataclass(frozen=True)
class Tier:
    number: int
    label: str
    grader: Grader


@dataclass(frozen=True)
class TierPolicy:
    expect: int
    below: BelowTier
    max_retries: int


@record
class Grade:
    tier: int
    label: str | None


@record
class PhaseOutcome:
    """How a phase attempt is committed: where the run goes next and what is recorded."""

    action: Action
    next_phase: str | None
    status: str
    grade: Grade | None = None
    rerun_of: int | None = None
    reason: str | None = None
    review: dict[str, Any] | None = field(default=None)

    @property
    def tier(self) -> int | None:
        return self.grade.tier if self.grade else None

    @property
    def tier_label(self) -> str | None:
        return self.grade.label if self.grade else None

    def commit_fields(self) -> dict[str, Any]:
        """What the commit statement records beyond a plain advance (all None for one)."""
        return {"outcome": {"retry": "retry", "escalate": "review"}.get(self.action),
                "rerun_of": self.rerun_of, "error": self.reason,
                "review_json": json.dumps(self.review) if self.review else None}

    @property
    def sends_successor(self) -> bool:
        return self.next_phase is not None and self.status == "running"

    @property
    def label(self) -> str:
        if self.action == "retry":
            return "tier_retry"
        if self.action == "escalate":
            return "awaiting_review"
        return "advanced" if self.next_phase else "completed"


def build_tiers(tiers: Sequence[tuple[str, Grader]]) -> list[Tier]:
    built: list[Tier] = []
    for number, item in enumerate(tiers, start=1):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and item[0] and callable(item[1])):
            raise TierDefinitionError(f"tier {number} must be a (label, grader) pair")
        if any(t.label == item[0] for t in built):
            raise TierDefinitionError(f"tier label {item[0]!r} declared twice")
        built.append(Tier(number, item[0], item[1]))
    return built


def build_policy(tiers: Sequence[Tier], phase: str, expect: str | int | None, below: str,
                 max_retries: int) -> TierPolicy | None:
    if expect is None:
        return None
    if not tiers:
        raise TierDefinitionError(f"phase {phase!r} expects a tier but the workflow declares "
                                  "no tiers (Workflow(..., tiers=[...]))")
    if isinstance(expect, str):
        number = next((t.number for t in tiers if t.label == expect), None)
        if number is None:
            raise TierDefinitionError(f"phase {phase!r} expects unknown tier {expect!r}; "
                                      f"tiers: {[t.label for t in tiers]}")
    else:
        number = expect
        if not 1 <= number <= len(tiers):
            raise TierDefinitionError(f"phase {phase!r} expects tier {number}, but tiers "
                                      f"are 1..{len(tiers)}")
    if below not in BELOW_TIER:
        raise TierDefinitionError(f"phase {phase!r}: below_tier must be one of {BELOW_TIER}")
    if max_retries < 0:
        raise TierDefinitionError(f"phase {phase!r}: max_tier_retries must be >= 0")
    return TierPolicy(number, cast(BelowTier, below), max_retries)


async def grade(tiers: Sequence[Tier], state: Any) -> Grade | None:
    """The highest consecutive passing tier, or None when the workflow has no tiers. A
    grader that raises fails the phase (and so is retried) rather than passing silently."""
    if not tiers:
        return None
    reached = Grade(0, None)
    for tier in tiers:
        passed = tier.grader(state)
        if inspect.isawaitable(passed):
            passed = await passed
        if not passed:
            break
        reached = Grade(tier.number, tier.label)
    return reached


def decide(workflow: Workflow, phase: Phase, seq: int, graded: Grade | None,
           tier_attempt: int, rerun_of: int | None) -> PhaseOutcome:
    """Where the run goes after ``phase`` ended with ``graded``."""
    following = workflow.next_phase(phase.name)
    advance = PhaseOutcome("advance", following, "running" if following else "completed",
                           graded, rerun_of)
    policy = phase.policy
    if policy is None or graded is None or graded.tier >= policy.expect:
        return advance
    expected = workflow.tiers[policy.expect - 1].label
    reached = f"tier {graded.tier}" + (f" ({graded.label})" if graded.label else "")
    if policy.below == "advance":
        return advance
    original = rerun_of if rerun_of is not None else seq
    if policy.below == "retry" and tier_attempt <= policy.max_retries:
        return PhaseOutcome("retry", phase.name, "running", graded, rerun_of)
    tries = f" after {tier_attempt} attempts" if policy.below == "retry" else ""
    reason = (f"below_tier: phase {phase.name} reached {reached}{tries}, expected tier "
              f"{policy.expect} ({expected})")
    review = {"kind": "below_tier", "seq": seq + 1, "phase": phase.name, "first_seq": original,
              "tier": graded.tier, "tier_label": graded.label, "expected": policy.expect,
              "expected_label": expected, "attempts": tier_attempt}
    # The last phase keeps its own name as the run's phase, so approve has a phase to name.
    return PhaseOutcome("escalate", following or phase.name, "awaiting_review", graded,
                        rerun_of, reason, review)
