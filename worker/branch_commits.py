"""Step 4 for the branching paths: a fork, a review that sends branches round again, or a
phase inside a branch. phasegate/branches.py and branch_review.py write the commit (the fan-in
is decided inside the branch's commit transaction); this sends every message it left.
"""

from __future__ import annotations

import asyncio
import time

from phasegate import metrics, tracing
from phasegate.branch_review import ReviewPlan, commit_review
from phasegate.branches import BranchPosition, ForkPlan, commit_branch, commit_fork
from phasegate.envelope import Envelope
from phasegate.faults import Faults
from phasegate.store import PhaseCommit, RunPosition, Store
from phasegate.worker.failures import Failures
from phasegate.worker.outcomes import Action, Emit, PhaseLog, Settlement
from phasegate.worker.transition_config import TransitionConfig
from phasegate.workflow import Workflow


class BranchCommits:
    def __init__(self, *, store: Store, config: TransitionConfig, faults: Faults, emit: Emit,
                 phase_log: PhaseLog, failures: Failures) -> None:
        self.store = store
        self.config = config
        self.faults = faults
        self._emit = emit
        self._phase_log = phase_log
        self.failures = failures

    async def commit(self, envelope: Envelope, workflow: Workflow, commit: PhaseCommit,
                     position: RunPosition, fork: ForkPlan | ReviewPlan | None,
                     started: float, commit_started: float) -> Settlement:
        with tracing.commit_span(envelope) as span:
            if isinstance(fork, ForkPlan) and commit.outcome is None:  # main, or nested
                done = await commit_fork(self.store, commit, fork, envelope,
                                         self.config.branch_bounds)
            elif isinstance(fork, ReviewPlan):
                done = await commit_review(self.store, commit, fork, envelope)
            else:
                assert isinstance(position, BranchPosition)
                done = await commit_branch(self.store, commit, position, envelope, workflow)
            span.set("checkpoint.success", done.committed)
        metrics.COMMIT_DURATION.observe(time.monotonic() - commit_started)
        if done.refused is not None:  # out of bounds: nothing written, the phase fails
            return await self.failures.fail(envelope, commit.phase, started, done.refused,
                                            retryable=False)
        if done.committed:
            self.faults.hit("after_commit")
            # A fork's start messages go out together (one SendMessageBatch with a sender).
            await asyncio.gather(*(self._emit(row, commit_started) for row in done.outbox))
            self.faults.hit("after_send")
        self._phase_log(envelope, commit.phase, started, done.label, tier=commit.tier)
        return Settlement(Action.DELETE, done.label)
