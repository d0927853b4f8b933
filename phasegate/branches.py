"""Branches: fan-out / fan-in, speculation (race) and the machinery behind ``ctx.fork``.

A phase on the main chain forks::

    @wf.phase("split")
    async def split(ctx: Context, state: dict) -> dict:
        ctx.fork([{"shard": i} for i in range(8)], merge="combine")
        return state

    @wf.phase("work")                 # runs once in every branch
    async def work(ctx: Context, state: dict) -> dict: ...

    @wf.phase("combine")              # runs once on main, after the fan-in
    async def combine(ctx: Context, state: dict) -> dict:
        total = sum(r.state["n"] for r in ctx.merged)

- A branch runs the workflow's phases strictly between the forking phase and the merge
  phase, in declaration order, starting from its own input. Branch ``f{seq}.b{i}`` (or
  ``f{seq}.{key}`` for a dict of inputs) has its own checkpoint chain (``checkpoints.branch``),
  its own position (``branches.next_seq``, first seq ``fork_seq + 1``) and its own SQS message
  group ``workflow_id/branch``, so branches run in parallel on different workers.
- The fork is committed at the forking phase's door in ONE statement with its checkpoint:
  the run moves to the merge phase without a main message, and the fork row, every branch row
  and one outbox start message per branch are written with it (``fork_commit``).
- Fan-in (``mode="all"``): a branch's final commit runs in a transaction that first locks the
  fork row (``SELECT ... FOR UPDATE``), commits the branch, then counts it; the commit that
  takes ``pending`` to 0 writes the merge message (kind ``merge``) to the outbox. Two "last"
  branches queue on the row lock; the second reads the first's decrement, so exactly one of
  them merges. The merge phase receives the parent's state and ``ctx.merged``: every
  branch's final state, in fork order.
- Race (``mode="race"``): the first branch to finish -- or to commit a checkpoint graded at
  ``win_tier`` or above -- wins under the same lock; the others are discarded in the same
  transaction. Their in-flight phases then fail their commit condition (the branch is no
  longer running) and are recorded as ``discarded`` checkpoints; they are never merged.
- Branches do not fork again, and below-tier policies (retry/escalate), reviews and the
  staleness door apply on the main chain only; in a branch, tiers are graded and recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, cast

import structlog

from phasegate import audit, residency
from phasegate.door import Halt
from phasegate.envelope import (
    BRANCH_PATTERN,
    MAIN_BRANCH,
    Envelope,
    canonical_json,
)
from phasegate.sql import queries
from phasegate.store import OutboxRow, PhaseCommit, RunPosition
from phasegate.versions import Corrupt, NeedsRestart, load_verified
from phasegate.workflow import NonRetryableError

if TYPE_CHECKING:
    from phasegate.store import Store
    from phasegate.workflow import Workflow

log = structlog.get_logger("phasegate.branches")

Mode = Literal["all", "race"]
MODES: tuple[str, ...] = ("all", "race")
# One outbox row and one SQS message per branch, all in the forking statement: keep it small.
MAX_BRANCHES = 64


def sql() -> dict[str, str]:
    return queries("branches.sql")


class ForkError(NonRetryableError):
    """``ctx.fork`` was called wrongly; the phase fails at once (its code must change)."""


@dataclass(frozen=True)
class ForkPlan:
    """A validated ``ctx.fork`` call: what the fork commit writes."""

    branches: tuple[tuple[str, str], ...]  # (branch name, input as canonical JSON)
    merge_phase: str
    first_phase: str
    after_merge: str | None
    mode: Mode
    win_tier: int | None

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.branches]


@dataclass(frozen=True)
class BranchResult:
    """One branch's final state, as a merge phase receives it (``ctx.merged``)."""

    branch: str
    state: Any
    seq: int
    tier: int | None = None
    tier_label: str | None = None


@dataclass(frozen=True)
class BranchPosition(RunPosition):
    """A branch's RunPosition plus the fork it belongs to."""

    branch: str = MAIN_BRANCH
    fork_seq: int = 0
    parent_branch: str = MAIN_BRANCH
    mode: str = "all"
    merge_phase: str = ""
    win_tier: int | None = None


@dataclass(frozen=True)
class Committed:
    """How a fork or branch commit ended, and what it left in the outbox to send now."""

    committed: bool
    label: str
    outbox: list[OutboxRow]


class Premature:
    """A merge phase's message arrived before its fork was resolved: it must not run."""


PREMATURE = Premature()


# -- ctx.fork -------------------------------------------------------------------------------


def plan_fork(workflow: Workflow | None, phase: str, seq: int, branch: str,
              inputs: Sequence[Any] | Mapping[str, Any], merge: str, mode: str,
              win_tier: str | int | None) -> ForkPlan:
    """Check a ``ctx.fork`` call against the workflow and name its branches."""
    if workflow is None:
        raise ForkError("ctx.fork needs the Context a worker builds (it knows the workflow)")
    if branch != MAIN_BRANCH:
        raise ForkError(f"ctx.fork in branch {branch}: branches do not fork again")
    if mode not in MODES:
        raise ForkError(f"ctx.fork mode must be one of {MODES}, not {mode!r}")
    target = workflow.get_phase(merge)
    here = workflow.get_phase(phase)
    if target is None or here is None:
        raise ForkError(f"ctx.fork merge={merge!r}: workflow {workflow.name} has no such phase")
    if merge not in workflow.merge_phases:
        raise ForkError(f"ctx.fork merge={merge!r}: declare it with @{workflow.name}.merge(...)"
                        " so the worker hands it the branches' states")
    if target.index < here.index + 2:
        raise ForkError(f"ctx.fork merge={merge!r}: the merge phase must come at least two "
                        f"phases after {phase!r} (branches run the phases in between)")
    named = (list(inputs.items()) if isinstance(inputs, Mapping)
             else [(f"b{i}", value) for i, value in enumerate(inputs)])
    if not 1 <= len(named) <= MAX_BRANCHES:
        raise ForkError(f"ctx.fork needs 1..{MAX_BRANCHES} inputs, got {len(named)}")
    branches = []
    for key, value in named:
        name = f"f{seq}.{key}"
        if not isinstance(key, str) or not BRANCH_PATTERN.match(name) or name == MAIN_BRANCH:
            raise ForkError(f"branch name {name!r} must be 1-26 chars of [A-Za-z0-9_.-]")
        try:
            branches.append((name, canonical_json(value)))
        except (TypeError, ValueError) as exc:
            raise ForkError(f"ctx.fork input for {key!r} is not JSON: {exc}") from None
    tier = _tier_number(workflow, win_tier, mode)
    following = workflow.next_phase(phase)
    assert following is not None
    return ForkPlan(tuple(branches), merge, following, workflow.next_phase(merge),
                    cast(Mode, mode), tier)


def _tier_number(workflow: Workflow, win_tier: str | int | None, mode: str) -> int | None:
    if win_tier is None:
        return None
    if mode != "race":
        raise ForkError("ctx.fork win_tier only applies to mode='race'")
    for tier in workflow.tiers:
        if win_tier in (tier.label, tier.number):
            return tier.number
    raise ForkError(f"ctx.fork win_tier={win_tier!r}: tiers are "
                    f"{[t.label for t in workflow.tiers]}")


# -- check: a branch's position, a merge phase's input -----------------------------------


async def load_branch(store: Store, workflow_id: str, branch: str) -> BranchPosition | None:
    row = await store.pool.fetchrow(sql()["load_branch"], workflow_id, branch)
    if row is None:
        return None
    return BranchPosition(
        workflow_id=row["workflow_id"], workflow=row["workflow"], status=row["status"],
        next_seq=row["next_seq"], base_seq=row["base_seq"],
        current_phase=row["current_phase"], schema_version=row["schema_version"],
        input_json=row["input"], attempts=row["attempts"], epoch=row["epoch"],
        state_json=row["state"], state_hash=row["state_hash"],
        state_version=row["state_version"], progress_json=row["progress"],
        branch=branch, fork_seq=row["fork_seq"], parent_branch=row["parent_branch"],
        mode=row["mode"],
        merge_phase=row["merge_phase"], win_tier=row["win_tier"])


async def merge_input(store: Store, workflow: Workflow, position: RunPosition, phase: str,
                      branch: str) -> list[BranchResult] | Premature | Halt:
    """``ctx.merged`` for a main-chain phase: the final states of the branches of the fork
    that merges into it (empty when none does). One query, only for merge phases."""
    if branch != MAIN_BRANCH or phase not in workflow.merge_phases \
            or position.next_seq == position.base_seq:
        return []
    rows = await store.pool.fetch(sql()["merge_input"], position.workflow_id,
                                  position.next_seq, phase, position.base_seq)
    if not rows:
        return []
    if rows[0]["fork_status"] == "open":
        return PREMATURE
    results = []
    for row in rows:
        if row["branch"] is None:
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
                                    row["tier_label"]))
    return results


# -- residency: the run's own store, and an audit event per checkpoint written -------------


@dataclass(frozen=True)
class Guarded:
    region: str | None
    classification: str

    def written(self, workflow_id: str, seq: int, branch: str, kind: str = "phase") -> None:
        if self.region is not None:
            audit.checkpoint_written(workflow_id=workflow_id, seq=seq, branch=branch,
                                     region=self.region, classification=self.classification,
                                     kind=kind)


async def guard(store: Store, workflow_id: str) -> Guarded:
    """Refuse (``ResidencyError``) a write for a run another regional store holds, exactly
    as the store's own write methods do (phasegate/residency.py)."""
    regional = (store.for_run(workflow_id) if isinstance(store, residency.StoreRouter)
                else store)
    if not isinstance(regional, residency.RegionalStore):
        return Guarded(None, "unknown")
    found = await regional.guard(workflow_id)
    return Guarded(regional.region, found.classification)


# -- commit ---------------------------------------------------------------------------------


def message(envelope: Envelope, seq: int, phase: str, branch: str,
            kind: Literal["phase", "merge"] = "phase") -> Envelope:
    """A message this one causes: a copy, so whatever else the envelope carries (trace
    context, routing hints) travels on to the branches and the merge."""
    return envelope.model_copy(update={"kind": kind, "seq": seq, "phase": phase,
                                       "branch": branch, "input": None})



async def commit_fork(store: Store, commit: PhaseCommit, plan: ForkPlan,
                      envelope: Envelope) -> Committed:
    """The forking phase's checkpoint, the fork and every branch's start message: one
    statement (``fork_commit``)."""
    messages = [message(envelope, commit.seq + 1, plan.first_phase, name)
                for name in plan.names]
    guarded = await guard(store, commit.workflow_id)
    rows = await store.pool.fetch(
        sql()["fork_commit"], commit.workflow_id, commit.seq, commit.phase,
        commit.schema_version, commit.state_json, commit.state_hash, plan.merge_phase,
        commit.tier, commit.tier_label, commit.resource_versions_json, commit.worker_id,
        commit.trace_id, plan.mode, plan.after_merge, plan.win_tier, plan.names,
        [value for _, value in plan.branches], plan.first_phase,
        [m.dedup_id for m in messages], [m.group_id for m in messages],
        [m.to_json() for m in messages])
    if not rows:
        return Committed(False, "superseded", [])
    ids = {row["dedup_id"]: row["outbox_id"] for row in rows}
    guarded.written(commit.workflow_id, commit.seq, commit.branch)
    log.info("forked", branches=len(messages), mode=plan.mode, merge=plan.merge_phase)
    return Committed(True, "forked", [OutboxRow(ids[m.dedup_id], m.dedup_id, m.group_id,
                                                m.to_json()) for m in messages])


async def commit_branch(store: Store, commit: PhaseCommit, position: BranchPosition,
                        envelope: Envelope, workflow: Workflow) -> Committed:
    """A branch phase's commit. Not its last: one statement. Its last (or a race won by
    tier): one transaction under the fork lock that also decides the fan-in."""
    following = workflow.next_phase(commit.phase)
    won = (position.mode == "race" and position.win_tier is not None
           and commit.tier is not None and commit.tier >= position.win_tier)
    final = following is None or following == position.merge_phase or won
    successor = None if final else (
        commit.successor if commit.successor is not None and commit.successor.phase == following
        else message(envelope, commit.seq + 1, following or "", envelope.branch))
    commit = replace(commit, next_phase=None if final else following, successor=successor)
    guarded = await guard(store, commit.workflow_id)
    if not final:
        row = await store.pool.fetchrow(sql()["branch_commit"], *_commit_args(commit, False))
        if row is None or row["committed_at"] is None:
            return await _refused(store, commit, guarded)
        guarded.written(commit.workflow_id, commit.seq, commit.branch)
        outbox = [] if successor is None or row["outbox_id"] is None else [OutboxRow(
            row["outbox_id"], successor.dedup_id, successor.group_id, successor.to_json())]
        return Committed(True, "advanced", outbox)
    async with store.pool.acquire() as connection, connection.transaction():
        fork = await connection.fetchrow(sql()["fork_lock"], commit.workflow_id,
                                         position.fork_seq)
        row = await connection.fetchrow(sql()["branch_commit"], *_commit_args(commit, True))
        if fork is None or row is None or row["committed_at"] is None:
            committed = False
        else:
            committed = True
            outbox = await _settle_fork(connection, envelope, position, fork)
    if not committed:
        return await _refused(store, commit, guarded)
    guarded.written(commit.workflow_id, commit.seq, commit.branch)
    label = "branch_completed" if not outbox else (
        "race_won" if position.mode == "race" else "fanned_in")
    return Committed(True, label, outbox)


async def _settle_fork(connection: Any, envelope: Envelope, position: BranchPosition,
                       fork: Any) -> list[OutboxRow]:
    """Under the fork lock, after this branch's final commit: count it; the last branch
    ('all') or the first to finish ('race') resolves the fork and enqueues the merge."""
    if fork["status"] != "open":  # resolved already: the branch commit above was refused
        return []
    resolution: str | None = None
    winner: str | None = None
    if fork["mode"] == "race":
        resolution, winner = "race", envelope.branch
    elif fork["pending"] - 1 == 0:
        resolution = "fan_in"
    merge = message(envelope, position.fork_seq + 1, fork["merge_phase"], MAIN_BRANCH,
                    "merge")
    row = await connection.fetchrow(
        sql()["fork_settle"], envelope.workflow_id, position.fork_seq, resolution, winner,
        merge.dedup_id, merge.group_id, merge.to_json())
    if resolution is None or row["outbox_id"] is None:
        return []
    log.info("fork_resolved", resolution=resolution, fork_seq=position.fork_seq,
             winner=winner)
    return [OutboxRow(row["outbox_id"], merge.dedup_id, merge.group_id, merge.to_json())]


def _commit_args(commit: PhaseCommit, final: bool) -> list[Any]:
    successor = commit.successor
    return [commit.workflow_id, commit.branch, commit.seq, commit.phase, commit.schema_version,
            commit.state_json, commit.state_hash, commit.next_phase, final, commit.tier,
            commit.tier_label, commit.resource_versions_json, commit.worker_id,
            commit.trace_id, successor.dedup_id if successor else None,
            successor.group_id if successor else None,
            successor.to_json() if successor else None]


async def _refused(store: Store, commit: PhaseCommit, guarded: Guarded) -> Committed:
    """The commit condition failed: another delivery committed first, or the branch was
    discarded (a race lost, a supervisor merge) -- then what the phase produced is recorded
    as a 'discarded' checkpoint."""
    discarded = await store.pool.fetchval(
        sql()["branch_discarded"], commit.workflow_id, commit.branch, commit.seq,
        commit.phase, commit.schema_version, commit.state_json, commit.state_hash,
        commit.tier, commit.tier_label, commit.worker_id, commit.trace_id)
    if discarded is not None:
        guarded.written(commit.workflow_id, commit.seq, commit.branch, "discarded")
        return Committed(False, "discarded", [])
    return Committed(False, "superseded", [])


# -- failures -------------------------------------------------------------------------------


async def record_failure(store: Store, workflow_id: str, branch: str, seq: int, error: str,
                         max_attempts: int) -> tuple[int, str] | None:
    """``Store.record_failure`` for a branch: at the limit the branch and the run fail."""
    await guard(store, workflow_id)
    row = await store.pool.fetchrow(sql()["branch_failure"], workflow_id, branch, error, seq,
                                    max_attempts)
    return (row["attempts"], row["status"]) if row else None


async def halt(store: Store, position: BranchPosition, status: str, reason: str) -> bool:
    """Stop a branch that cannot go on, and its run, with the reason."""
    await guard(store, position.workflow_id)
    return await store.pool.fetchval(
        sql()["branch_halt"], position.workflow_id, position.branch, position.next_seq, reason,
        status) is not None


# -- the control plane's view ---------------------------------------------------------------


def tree_rows_to_json(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """``branch_tree`` rows as forks, each with its branches (the API's JSON shape)."""
    forks: dict[int, dict[str, Any]] = {}
    for row in rows:
        fork = forks.setdefault(row["fork_seq"], {
            "fork_seq": row["fork_seq"], "mode": row["mode"], "merge_phase": row["merge_phase"],
            "status": row["fork_status"], "resolution": row["resolution"],
            "winner": row["winner"], "branch_count": row["branch_count"],
            "pending": row["pending"], "branches": []})
        steps = []
        for step in row["steps"]:
            seq, phase, kind = step.split(":", 2)
            steps.append({"seq": int(seq), "phase": phase, "kind": kind})
        fork["branches"].append({
            "branch": row["branch"], "status": row["status"], "next_seq": row["next_seq"],
            "final_seq": row["final_seq"], "current_phase": row["current_phase"],
            "tier": row["tier"], "tier_label": row["tier_label"], "error": row["error"],
            "steps": steps})
    return list(forks.values())

