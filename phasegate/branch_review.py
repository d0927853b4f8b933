"""The merge point: what a merge phase receives (``merge_input``: ``ctx.merged``) and what it
decides about its branches -- accept, discard or retry.

A merge phase sees every branch of its fork in ``ctx.merged`` (finished ones with their final
state, failed ones with ``status="failed"``) and may decide per branch::

    @wf.merge("pick")
    async def pick(ctx: Context, state: dict) -> dict:
        bad = [r.branch for r in ctx.merged if not r.ok or r.state["score"] < 0.8]
        if bad:
            ctx.review_branches({name: Retry() for name in bad})   # same input again
            return {**state, "rounds": state.get("rounds", 0) + 1}
        return {**state, "best": max(r.state["score"] for r in ctx.merged)}

Decisions: ``"accept"`` (the default for a branch not named), ``"discard"`` (recorded
``discarded``, left out of later rounds), ``"retry"`` / ``Retry()`` (the same input) or
``Retry(input=...)`` (a new one).

- Without a retry, the phase commits as usual and the run goes on; discarded branches are
  marked just before that commit (while the parent is still at the merge seq).
- With a retry, ONE statement under the fork lock (``review_commit``): the merge phase's state
  is checkpointed on the parent chain at its seq (the state the next round receives), the
  parent moves one seq on but stays at the merge phase, the fork is reopened with the retried
  branches pending, each retried branch starts a new attempt (new seqs, its own checkpoints
  and step records) and gets its start message. When they finish, the fan-in (the same
  locked count as the first time) sends the merge message again and the merge phase runs its
  next round with every accepted and retried branch.
- The budget: ``ctx.fork(..., max_retries=N)`` (default 3) branch retries per fork, over all
  rounds. Asking for more fails the merge phase (``ForkError``, not retried).

Race-freedom is the fan-in's: the review commit locks the fork row first and is conditional
on the parent still being at the merge seq, so a duplicate delivery of the merge message
commits nothing, and no branch can be counted by a fan-in while a review reopens its fork.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from phasegate.branches import (
    PREMATURE,
    BranchResult,
    Committed,
    ForkError,
    Premature,
    _refused,
    guard,
    message,
    sql,
)
from phasegate.door import Halt
from phasegate.envelope import MAIN_BRANCH, Envelope, canonical_json
from phasegate.store import OutboxRow
from phasegate.versions import Corrupt, NeedsRestart, load_verified

if TYPE_CHECKING:
    from phasegate.store import PhaseCommit, RunPosition, Store
    from phasegate.workflow import Workflow

log = structlog.get_logger("phasegate.branches")

DECISIONS = ("accept", "discard", "retry")
_SAME = object()


class MergedBranches(list[BranchResult]):
    """``ctx.merged``: the branches in fork order, plus what a review needs to know."""

    def __init__(self, results: list[BranchResult], *, parent: str = MAIN_BRANCH,
                 fork_seq: int = 0, retries_left: int = 0,
                 first_phase: str | None = None) -> None:
        super().__init__(results)
        self.parent = parent
        self.fork_seq = fork_seq
        self.retries_left = retries_left
        self.first_phase = first_phase  # where a retried branch starts again


async def merge_input(store: Store, workflow: Workflow, position: RunPosition, phase: str,
                      branch: str) -> list[BranchResult] | Premature | Halt:
    """``ctx.merged`` for a merge phase (on the main chain or in a branch): the branches of
    the fork that merges into it, in fork order (empty when none does). One query, only for
    merge phases."""
    if phase not in workflow.merge_phases or position.next_seq == position.base_seq:
        return []
    rows = await store.pool.fetch(sql()["merge_input"], position.workflow_id,
                                  position.next_seq, phase, position.base_seq, branch)
    if not rows:
        return []
    if rows[0]["fork_status"] == "open":
        return PREMATURE
    forked_in = rows[0]["fork_phase"]
    results = MergedBranches([], parent=branch, fork_seq=rows[0]["fork_seq"],
                             retries_left=max(0, rows[0]["retries_left"]),
                             first_phase=(workflow.next_phase(forked_in)
                                          if workflow.get_phase(forked_in or "") else None))
    for row in rows:
        if row["branch"] is None:
            continue
        started = json.loads(row["input"]) if row["input"] is not None else None
        if row["branch_status"] in ("failed", "stale"):
            results.append(BranchResult(row["branch"], None, None, status=row["branch_status"],
                                        error=row["error"], input=started,
                                        retries=row["retries"]))
            continue
        if row["state"] is None:
            return Halt("failed", f"checkpoint_missing: branch {row['branch']} has no final "
                        f"state at seq {row['final_seq']}")
        try:
            state = await load_verified(workflow, row["final_seq"], row["state"],
                                        row["state_hash"], row["state_version"])
        except Corrupt as exc:
            return Halt("failed", f"branch {row['branch']}: {exc}")
        except NeedsRestart as exc:
            return Halt("needs_restart", f"branch {row['branch']}: {exc}")
        results.append(BranchResult(row["branch"], state, row["final_seq"], row["tier"],
                                    row["tier_label"], input=started, retries=row["retries"]))
    return results


@dataclass(frozen=True)
class Retry:
    """Run a branch again as a new attempt: from ``input``, or (without it) the same input."""

    input: Any = _SAME


@dataclass(frozen=True)
class ReviewPlan:
    """A validated ``ctx.review_branches`` call: what the merge phase's commit writes."""

    parent: str
    fork_seq: int
    first_phase: str
    retries: tuple[tuple[str, str | None], ...]  # (branch, new input as JSON, or None)
    discards: tuple[str, ...]

    @property
    def retried(self) -> list[str]:
        return [name for name, _ in self.retries]


def plan_review(merged: list[BranchResult], decisions: Mapping[str, Any]) -> ReviewPlan:
    """Check a review against the branches the merge phase received."""
    if not isinstance(merged, MergedBranches) or merged.first_phase is None:
        raise ForkError("ctx.review_branches is for a merge phase that received branches "
                        "(ctx.merged is empty here)")
    known = {r.branch for r in merged}
    retries: list[tuple[str, str | None]] = []
    discards: list[str] = []
    for name, decision in decisions.items():
        if name not in known:
            raise ForkError(f"ctx.review_branches: {name!r} is not a branch of this merge "
                            f"(branches: {sorted(known)})")
        if decision == "accept":
            continue
        if decision == "discard":
            discards.append(name)
        elif decision == "retry" or isinstance(decision, Retry):
            retries.append((name, _input_json(name, decision)))
        else:
            raise ForkError(f"ctx.review_branches: decision for {name!r} must be one of "
                            f"{DECISIONS} or Retry(input=...), not {decision!r}")
    if len(retries) > merged.retries_left:
        raise ForkError(f"ctx.review_branches: {len(retries)} retries asked, the fork's "
                        f"budget has {merged.retries_left} left (ctx.fork(max_retries=...))")
    return ReviewPlan(merged.parent, merged.fork_seq, merged.first_phase, tuple(retries),
                      tuple(discards))


def _input_json(name: str, decision: Any) -> str | None:
    if not isinstance(decision, Retry) or decision.input is _SAME:
        return None
    try:
        return canonical_json(decision.input)
    except (TypeError, ValueError) as exc:
        raise ForkError(f"ctx.review_branches: the new input for {name!r} is not JSON: "
                        f"{exc}") from None


async def apply_discards(store: Store, workflow_id: str, plan: ReviewPlan, seq: int) -> None:
    """A review without retries: mark its discards (before the merge phase's commit)."""
    if plan.discards:
        await guard(store, workflow_id)
        await store.pool.execute(sql()["review_discards"], workflow_id, plan.parent,
                                 plan.fork_seq, seq, list(plan.discards))


async def commit_review(store: Store, commit: PhaseCommit, plan: ReviewPlan,
                        envelope: Envelope) -> Committed:
    """A review round that retries branches: one statement under the fork lock."""
    guarded = await guard(store, commit.workflow_id)
    async with store.pool.acquire() as connection, connection.transaction():
        fork = await connection.fetchrow(sql()["fork_lock"], commit.workflow_id,
                                         plan.fork_seq, plan.parent)
        if fork is None or fork["status"] != "merged":
            return Committed(False, "superseded", [])
        positions = {r["branch"]: r["next_seq"] for r in await connection.fetch(
            sql()["fork_branches"], commit.workflow_id, plan.parent, plan.fork_seq)}
        messages = [message(envelope, positions[name] + 1, plan.first_phase, name)
                    for name in plan.retried]
        rows = await connection.fetch(
            sql()["review_commit"], commit.workflow_id, plan.parent, commit.seq, commit.phase,
            commit.schema_version, commit.state_json, commit.state_hash, commit.tier,
            commit.tier_label, commit.worker_id, commit.trace_id, plan.fork_seq,
            plan.retried, [value for _, value in plan.retries], list(plan.discards),
            plan.first_phase, [m.seq for m in messages], [m.dedup_id for m in messages],
            [m.group_id for m in messages], [m.to_json() for m in messages])
    if not rows:
        return await _refused(store, commit, guarded)
    guarded.written(commit.workflow_id, commit.seq, commit.branch)
    ids = {row["dedup_id"]: row["outbox_id"] for row in rows}
    log.info("review_retry", retried=plan.retried, discarded=list(plan.discards),
             fork_seq=plan.fork_seq, parent=plan.parent)
    return Committed(True, "review_retry", [OutboxRow(ids[m.dedup_id], m.dedup_id,
                                                      m.group_id, m.to_json())
                                            for m in messages if m.dedup_id in ids])

