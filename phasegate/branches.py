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
- Nested: ``ctx.fork`` in a branch forks child branches (``parent_branch`` = that branch,
  ``depth`` + 1) whose fan-in promotes into the parent branch (its merge phase runs on the
  branch's chain), never into the main chain. Bounded by ``PHASEGATE_BRANCH_MAX_DEPTH`` and
  ``PHASEGATE_BRANCH_MAX_LIVE``: a fork beyond either fails its phase (``ForkError``, not
  retried) and writes nothing.
- Failures: a branch that exhausts its retries is ``failed`` and counted under the fork lock
  like a finished one. ``require="all"`` fails the parent (the run, or the parent branch one
  level up) at once; otherwise a race goes on (and fails only when every branch failed) and
  an ``all`` fork fans in with the failed branches in ``ctx.merged`` (``status="failed"``).
- Review: the merge phase may accept, discard or retry branches (phasegate/branch_review.py).
- A race's deadline: phasegate/race_deadline.py. A branch's doors (staleness, below-tier
  retry; escalation fails the branch): phasegate/branch_doors.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, cast

import structlog

from phasegate import audit, residency
from phasegate.envelope import (
    BRANCH_PATTERN,
    MAIN_BRANCH,
    Envelope,
    canonical_json,
)
from phasegate.records import record
from phasegate.sql import queries
from phasegate.store import OutboxRow, PhaseCommit, RunPosition, position_fields
from phasegate.waits import MAX_WAIT_S
from phasegate.workflow import NonRetryableError

if TYPE_CHECKING:
    from phasegate.store import Store
    from phasegate.workflow import Workflow

log = structlog.get_logger("phasegate.branches")

Mode = Literal["all", "race"]
MODES: tuple[str, ...] = ("all", "race")
# One outbox row and one SQS message per branch, all in the forking statement: keep it small.
MAX_BRANCHES = 64
# Branch retries a merge phase's review may ask for per fork, unless ctx.fork says otherwise.
DEFAULT_FORK_RETRIES = 3


def sql() -> dict[str, str]:
    return queries("branches.sql")


class ForkError(NonRetryableError):
    """``ctx.fork`` was called wrongly; the phase fails at once (its code must change)."""


class BelowTierError(NonRetryableError):
    """A branch phase's below-tier result would escalate: the branch fails, its merge decides."""


@dataclass(frozen=True)
class ForkPlan:
    """A validated ``ctx.fork`` call: what the fork commit writes."""

    branches: tuple[tuple[str, str], ...]  # (branch name, input as canonical JSON)
    merge_phase: str
    first_phase: str
    after_merge: str | None
    mode: Mode
    win_tier: int | None
    parent: str = MAIN_BRANCH
    depth: int = 1  # the new branches' depth
    require_all: bool = False
    max_retries: int = DEFAULT_FORK_RETRIES
    deadline_s: float | None = None  # a race's deadline, from the fork's commit (database time)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.branches]


@record
class ForkScope:
    """Where a phase runs, for ``ctx.fork``: its branch's own merge phase and depth."""

    merge_phase: str | None = None  # None on the main chain
    depth: int = 0


@dataclass(frozen=True)
class BranchResult:
    """One branch as a merge phase receives it (``ctx.merged``): its final state when it
    finished (``status="merged"``), or ``status="failed"`` (``"stale"``: its staleness
    check stopped it) with ``state=None`` and the error line. ``input`` is what its current
    attempt started from; ``retries`` how often a review sent it round again."""

    branch: str
    state: Any
    seq: int | None
    tier: int | None = None
    tier_label: str | None = None
    status: str = "merged"
    error: str | None = None
    input: Any = None
    retries: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "merged"

    @property
    def error_type(self) -> str | None:
        """The exception's class name, e.g. ``"TimeoutError"`` (None when it did not fail)."""
        if self.error is None:
            return None
        return self.error.split(":", 1)[0].split(" ", 1)[0]


@record
class BranchPosition(RunPosition):
    """A branch's RunPosition plus the fork it belongs to."""

    branch: str = MAIN_BRANCH
    fork_seq: int = 0
    parent_branch: str = MAIN_BRANCH
    depth: int = 1
    mode: str = "all"
    merge_phase: str = ""
    win_tier: int | None = None


@dataclass(frozen=True)
class Committed:
    """How a fork or branch commit ended, and what it left in the outbox to send now.
    ``refused``: the fork broke a bound, or a branch phase's below-tier result would escalate
    -- nothing was written; the phase fails with it."""

    committed: bool
    label: str
    outbox: list[OutboxRow]
    refused: NonRetryableError | None = None


class Premature:
    """A merge phase's message arrived before its fork was resolved: it must not run."""


PREMATURE = Premature()


# -- ctx.fork -------------------------------------------------------------------------------


def plan_fork(workflow: Workflow | None, phase: str, seq: int, branch: str,
              inputs: Sequence[Any] | Mapping[str, Any], merge: str, mode: str,
              win_tier: str | int | None, *, scope: ForkScope | None = None,
              require: str | None = None,
              max_retries: int = DEFAULT_FORK_RETRIES,
              deadline_s: float | None = None) -> ForkPlan:
    """Check a ``ctx.fork`` call against the workflow and name its branches."""
    if workflow is None:
        raise ForkError("ctx.fork needs the Context a worker builds (it knows the workflow)")
    scope = scope or ForkScope()
    if require not in (None, "all"):
        raise ForkError(f"ctx.fork require must be None or 'all', not {require!r}")
    if not isinstance(max_retries, int) or max_retries < 0:
        raise ForkError(f"ctx.fork max_retries must be an int >= 0, not {max_retries!r}")
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
    enclosing = workflow.get_phase(scope.merge_phase) if scope.merge_phase else None
    if branch != MAIN_BRANCH and enclosing is None:
        raise ForkError(f"ctx.fork in branch {branch} needs the Context a worker builds (it "
                        "knows the branch's own merge phase)")
    if enclosing is not None and target.index >= enclosing.index:
        raise ForkError(f"ctx.fork merge={merge!r} in branch {branch}: a nested fork must "
                        f"merge before its branch's own merge phase {scope.merge_phase!r}")
    named = (list(inputs.items()) if isinstance(inputs, Mapping)
             else [(f"b{i}", value) for i, value in enumerate(inputs)])
    if not 1 <= len(named) <= MAX_BRANCHES:
        raise ForkError(f"ctx.fork needs 1..{MAX_BRANCHES} inputs, got {len(named)}")
    branches = []
    prefix = "" if branch == MAIN_BRANCH else f"{branch}."
    for key, value in named:
        name = f"{prefix}f{seq}.{key}"
        if not isinstance(key, str) or not BRANCH_PATTERN.fullmatch(name) or name == MAIN_BRANCH:
            raise ForkError(f"branch name {name!r} must be 1-26 chars of [A-Za-z0-9_.-] "
                            "(a nested branch's name starts with its parent's)")
        try:
            branches.append((name, canonical_json(value)))
        except (TypeError, ValueError) as exc:
            raise ForkError(f"ctx.fork input for {key!r} is not JSON: {exc}") from None
    tier = _tier_number(workflow, win_tier, mode)
    following = workflow.next_phase(phase)
    assert following is not None
    return ForkPlan(tuple(branches), merge, following, workflow.next_phase(merge),
                    cast(Mode, mode), tier, branch, scope.depth + 1, require == "all",
                    max_retries, _deadline(deadline_s, mode))


def _deadline(deadline_s: object, mode: str) -> float | None:
    if deadline_s is None:
        return None
    if mode != "race":
        raise ForkError("ctx.fork deadline_s only applies to mode='race'")
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, int | float) \
            or not math.isfinite(deadline_s) or not 0 < deadline_s <= MAX_WAIT_S:
        raise ForkError(f"ctx.fork deadline_s must be seconds in (0, {MAX_WAIT_S:.0f}], "
                        f"not {deadline_s!r}")
    return float(deadline_s)


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
    """A branch's position. A branch still ``running`` under an ancestor that is not (a race
    lost above it) is dead: it is recorded ``discarded`` here, the first time a message of it
    arrives, so it stops counting as live (its own row only: no lock beyond it)."""
    row = await store.pool.fetchrow(sql()["load_branch"], workflow_id, branch)
    if row is None:
        return None
    if row["status"] == "discarded" and row["own_status"] == "running":
        await store.pool.fetchval(sql()["branch_orphaned"], workflow_id, branch)
        log.info("branch_orphaned", branch=branch)
    return BranchPosition(
        **position_fields(row),
        branch=branch, fork_seq=row["fork_seq"], parent_branch=row["parent_branch"],
        depth=row["depth"], mode=row["mode"],
        merge_phase=row["merge_phase"], win_tier=row["win_tier"])


def fork_scope(position: RunPosition) -> ForkScope:
    """What ``ctx.fork`` needs to know of where the phase runs."""
    if isinstance(position, BranchPosition):
        return ForkScope(position.merge_phase, position.depth)
    return ForkScope()


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
            kind: Literal["phase", "merge", "deadline"] = "phase") -> Envelope:
    """A message this one causes: a copy, so whatever else the envelope carries (trace
    context, routing hints) travels on to the branches and the merge."""
    return envelope.model_copy(update={"kind": kind, "seq": seq, "phase": phase,
                                       "branch": branch, "input": None})



@dataclass(frozen=True)
class Bounds:
    """How deep branches may nest and how many may be live in one run (settings)."""

    max_depth: int = 3
    max_live: int = 64


async def out_of_bounds(store: Store, workflow_id: str, plan: ForkPlan,
                        bounds: Bounds) -> ForkError | None:
    """Why this fork may not happen, or None. The live count is read just before the fork
    statement: two forks committing in the same instant can together pass the bound by one
    fork's branches (the bound keeps runaway recursion in check; it is not a quota)."""
    if plan.depth > bounds.max_depth:
        return ForkError(f"ctx.fork in branch {plan.parent}: depth {plan.depth} is beyond "
                         f"PHASEGATE_BRANCH_MAX_DEPTH={bounds.max_depth}")
    live = int(await store.pool.fetchval(sql()["live_branches"], workflow_id))
    if live + len(plan.branches) > bounds.max_live:
        return ForkError(f"ctx.fork of {len(plan.branches)} branches: the run has {live} live "
                         f"branches, PHASEGATE_BRANCH_MAX_LIVE={bounds.max_live}")
    return None


async def commit_fork(store: Store, commit: PhaseCommit, plan: ForkPlan,
                      envelope: Envelope, bounds: Bounds | None = None) -> Committed:
    """The forking phase's checkpoint (on the main chain or in a branch), the fork and every
    branch's start message: one statement (``fork_commit``); nothing when out of bounds."""
    refused = await out_of_bounds(store, commit.workflow_id, plan, bounds or Bounds())
    if refused is not None:
        log.warning("fork_refused", reason=str(refused))
        return Committed(False, "fork_refused", [], refused)
    messages = [message(envelope, commit.seq + 1, plan.first_phase, name)
                for name in plan.names]
    # A race's deadline: seq = the fork's seq, on the parent chain (phasegate/race_deadline.py).
    deadline = message(envelope, commit.seq, plan.merge_phase, plan.parent, "deadline")
    timed = plan.deadline_s is not None
    guarded = await guard(store, commit.workflow_id)
    rows = await store.pool.fetch(
        sql()["fork_commit"], commit.workflow_id, commit.seq, commit.phase,
        commit.schema_version, commit.state_json, commit.state_hash, plan.merge_phase,
        commit.tier, commit.tier_label, commit.resource_versions_json, commit.worker_id,
        commit.trace_id, plan.mode, plan.after_merge, plan.win_tier, plan.names,
        [value for _, value in plan.branches], plan.first_phase,
        [m.dedup_id for m in messages], [m.group_id for m in messages],
        [m.to_json() for m in messages], plan.parent, plan.require_all, plan.max_retries,
        plan.depth, plan.deadline_s, deadline.dedup_id if timed else None,
        deadline.group_id if timed else None, deadline.to_json() if timed else None)
    if not rows:
        return Committed(False, "superseded", [])
    ids = {row["dedup_id"]: row["outbox_id"] for row in rows}
    guarded.written(commit.workflow_id, commit.seq, commit.branch)
    log.info("forked", branches=len(messages), mode=plan.mode, merge=plan.merge_phase,
             depth=plan.depth)
    return Committed(True, "forked", [OutboxRow(ids[m.dedup_id], m.dedup_id, m.group_id,
                                                m.to_json()) for m in messages])


async def commit_branch(store: Store, commit: PhaseCommit, position: BranchPosition,
                        envelope: Envelope, workflow: Workflow) -> Committed:
    """A branch phase's commit. Not its last: one statement. Its last (or a race won by
    tier): one transaction under the fork lock that also decides the fan-in. A below-tier
    ``retry`` runs the same phase again in the branch; a result the tier policy would
    escalate is refused (``BelowTierError``): the branch fails, its fork decides."""
    won = (position.mode == "race" and position.win_tier is not None
           and commit.tier is not None and commit.tier >= position.win_tier)
    if commit.outcome == "review" and not won:
        return Committed(False, "below_tier", [], BelowTierError(commit.error or "below_tier"))
    retrying = commit.outcome == "retry" and not won
    following = commit.phase if retrying else workflow.next_phase(commit.phase)
    final = won or (not retrying and following in (None, position.merge_phase))
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
                                         position.fork_seq, position.parent_branch)
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
    return await settle(connection, envelope, position.parent_branch, position.fork_seq,
                        fork, resolution, winner)


async def settle(connection: Any, envelope: Envelope, parent: str, fork_seq: int, fork: Any,
                 resolution: str | None, winner: str | None) -> list[OutboxRow]:
    """Count one finished (or failed) branch of the locked fork; with a resolution, resolve
    it and enqueue the merge message on the parent chain at the fork's merge seq."""
    merge = message(envelope, fork["merge_seq"], fork["merge_phase"], parent, "merge")
    row = await connection.fetchrow(
        sql()["fork_settle"], envelope.workflow_id, fork_seq, resolution, winner,
        merge.dedup_id, merge.group_id, merge.to_json(), parent)
    if resolution is None or row["outbox_id"] is None:
        return []
    log.info("fork_resolved", resolution=resolution, fork_seq=fork_seq, parent=parent,
             winner=winner)
    return [OutboxRow(row["outbox_id"], merge.dedup_id, merge.group_id, merge.to_json())]


def _commit_args(commit: PhaseCommit, final: bool) -> list[Any]:
    successor = commit.successor
    return [commit.workflow_id, commit.branch, commit.seq, commit.phase, commit.schema_version,
            commit.state_json, commit.state_hash, commit.next_phase, final, commit.tier,
            commit.tier_label, commit.resource_versions_json, commit.worker_id,
            commit.trace_id, successor.dedup_id if successor else None,
            successor.group_id if successor else None,
            successor.to_json() if successor else None,
            None if final else commit.outcome, None if final else commit.rerun_of]


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
