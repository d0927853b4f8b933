"""``Context``: what a running phase can see and do."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog

from phasegate.branch_review import ReviewPlan, plan_review
from phasegate.branches import DEFAULT_FORK_RETRIES, BranchResult, ForkPlan, ForkScope, plan_fork
from phasegate.staleness import Observations
from phasegate.steps import Category, Steps
from phasegate.waits import Wait, WaitError, signal_wait, timer

if TYPE_CHECKING:
    from phasegate.workflow import Workflow

# A lazy proxy holds no state of its own (it binds at each call, from the configuration then
# in force), so every Context can share one instead of making one per phase.
_PHASE_LOG = structlog.get_logger("phasegate.phase")


@dataclass
class Context:
    """Handed to every phase. Identity of the run, the attempt, and in-phase progress.

    ``progress(state)`` publishes the phase's latest partial state in memory (cheap, no I/O);
    the worker persists it as an ``emergency`` checkpoint when it must (memory pressure), and a
    restarted phase finds it again as ``resumed_progress``.

    Inside the room (``phasegate/steps.py``, ``phasegate/staleness.py``): ``step()`` runs a
    replay-safe step, ``deliver()``/``pending()``/``batch_done()`` keep the receipt ledger,
    ``observe()`` records an external resource in the staleness envelope, and
    ``tier_attempt`` counts the attempts of this phase from the same input (below-tier
    retries, rejected reviews).
    """

    workflow_id: str
    workflow: str
    phase: str
    seq: int
    branch: str
    attempt: int
    worker_id: str
    schema_version: int
    resumed_progress: Any = None
    log: Any = field(default=None, repr=False)
    _progress: Any = field(default=None, repr=False)
    _progress_version: int = field(default=0, repr=False)
    tier_attempt: int = 1
    steps: Steps | None = field(default=None, repr=False)
    observed: Observations = field(default_factory=Observations, repr=False)
    # Branches (phasegate/branches.py): a merge phase's inputs, and a fork this phase asked for.
    merged: list[BranchResult] = field(default_factory=list, repr=False)
    workflow_def: Workflow | None = field(default=None, repr=False)
    fork_plan: ForkPlan | None = field(default=None, repr=False)
    # Where this phase runs, for a nested fork (its branch's merge phase and depth).
    fork_scope: ForkScope | None = field(default=None, repr=False)
    review_plan: ReviewPlan | None = field(default=None, repr=False)
    # Waits (phasegate/waits.py): the payload of the signal this phase was woken by (None:
    # none, or the wait timed out), and the wait this phase asked for before its successor.
    signal: Any = None
    wait: Wait | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.log is None:
            self.log = _PHASE_LOG

    def progress(self, state: Any) -> None:
        """Publish the latest in-phase partial state (kept in memory until a flush needs it)."""
        self._progress = copy.deepcopy(state)
        self._progress_version += 1

    @property
    def latest_progress(self) -> tuple[int, Any]:
        return self._progress_version, self._progress

    # -- inside the room ------------------------------------------------------------------

    async def step(self, name: str, fn: Callable[..., Any], *args: Any,
                   category: Category = "read", cache: bool = False) -> Any:
        """Run ``fn(*args)`` as step ``name``; returns its JSON output.

        ``read`` steps run again on replay (unless ``cache=True``); ``write``/``execute``
        steps get ``idempotency_key=`` and are recorded before and after they run, so a
        replay returns the recorded output, or calls again with the same key."""
        return await self._steps().step(name, fn, *args, category=category, cache=cache)

    async def deliver(self, batch_id: str, artifact_id: str, fn: Callable[..., Any],
                      *args: Any) -> Any:
        """Deliver an artifact once per run: ``fn(*args, idempotency_key=...)`` unless a
        receipt exists; returns the (recorded) receipt, which must be JSON."""
        return await self._steps().deliver(batch_id, artifact_id, fn, *args)

    async def pending(self, batch_ids: Iterable[str]) -> list[str]:
        """The batches, in order, not yet marked processed with ``batch_done``."""
        return await self._steps().pending(batch_ids)

    async def batch_done(self, batch_id: str) -> None:
        """Mark a batch processed: ``pending`` leaves it out from now on."""
        await self._steps().batch_done(batch_id)

    def observe(self, resource_id: str, resource_type: str, version_token: str | int) -> None:
        """Record that this phase relied on ``resource_id`` at ``version_token``."""
        self.observed.observe(resource_id, resource_type, version_token)

    # -- branches -------------------------------------------------------------------------

    def fork(self, inputs: Sequence[Any] | Mapping[str, Any], *, merge: str,
             mode: str = "all", win_tier: str | int | None = None,
             require: str | None = None,
             max_retries: int = DEFAULT_FORK_RETRIES,
             deadline_s: float | None = None) -> list[str]:
        """Fork one branch per input when this phase commits; returns the branch names.

        Each branch runs the phases between this one and ``merge`` (declared with
        ``@wf.merge``) from its input, in parallel. ``mode="all"``: ``merge`` runs once every
        branch has finished or failed, with all of them in ``ctx.merged``. ``mode="race"``:
        the first branch to finish -- or to reach ``win_tier`` -- wins and the others are
        discarded; failed branches are recorded and the race goes on (the run fails only
        when every branch failed). ``require="all"``: one failed branch fails the run.
        ``max_retries``: how many branch retries the merge phase's review may ask for.
        ``deadline_s`` (race only): if no branch has won that many seconds after this commit
        (database time), the race ends, its branches are discarded and the run (or the
        parent branch) fails with ``RaceDeadlineExceeded``.
        Called in a branch, it forks child branches that merge back into that branch. The
        fork is written with this phase's checkpoint, in one statement."""
        if self.fork_plan is not None:
            raise RuntimeError("ctx.fork was already called in this phase")
        if self.wait is not None:
            raise WaitError("a phase that waits cannot also fork")
        self.fork_plan = plan_fork(self.workflow_def, self.phase, self.seq, self.branch,
                                   inputs, merge, mode, win_tier, scope=self.fork_scope,
                                   require=require, max_retries=max_retries,
                                   deadline_s=deadline_s)
        return self.fork_plan.names

    def review_branches(self, decisions: Mapping[str, Any]) -> None:
        """In a merge phase: decide per branch -- ``"accept"`` (the default), ``"discard"``,
        ``"retry"`` / ``Retry()`` (same input) or ``Retry(input=...)``. With a retry the
        merge phase runs again once the retried branches finish (phasegate/branch_review.py).
        """
        if self.review_plan is not None:
            raise RuntimeError("ctx.review_branches was already called in this phase")
        self.review_plan = plan_review(self.merged, decisions)

    @property
    def branching(self) -> ForkPlan | ReviewPlan | None:
        """What this phase's commit must write beyond a checkpoint: a fork or a review."""
        return self.fork_plan or self.review_plan
    # -- waits ----------------------------------------------------------------------------

    def defer_next(self, seconds: float | None = None, *,
                   until: datetime | None = None) -> None:
        """Make the next phase deliverable no earlier than ``seconds`` from this phase's commit
        (database time) or than ``until`` (a timezone-aware datetime); at most a year ahead.
        Committed with this phase: no worker is held while the run waits."""
        self._set_wait(timer(seconds, until=until))

    def wait_for_signal(self, name: str, *, timeout_s: float) -> None:
        """Run the next phase when signal ``name`` arrives for this run (a signal already sent
        counts), or after ``timeout_s``. The next phase sees the payload as ``ctx.signal``
        (None on timeout)."""
        self._set_wait(signal_wait(name, timeout_s))

    def _set_wait(self, wait: Wait) -> None:
        if self.wait is not None:
            raise WaitError("this phase already asked for a wait (one per phase)")
        if self.branch != "main" or self.fork_plan is not None:
            raise WaitError("waits are for the main chain: not inside a branch or with a fork")
        self.wait = wait

    def _steps(self) -> Steps:
        if self.steps is None:
            raise RuntimeError("this Context has no step ledger (steps run inside a worker, "
                               "or give Context(steps=Steps(MemoryLedger(), ...)) in tests)")
        return self.steps
