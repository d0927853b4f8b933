"""What the transition records when a phase does not advance its run: a failed attempt
(retried with backoff until the budget is spent, then the run or branch fails), a halt before
the phase runs (a missing or corrupt checkpoint, an old schema), and a halt at the door.

A branch records its own failures (phasegate/branch_failures.py, branch_doors.py); a failure
there may fan its fork in, so the messages it leaves are sent here too.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from phasegate import redact
from phasegate.branch_doors import halt as halt_branch_at_door
from phasegate.branch_failures import halt as halt_branch
from phasegate.branch_failures import record_failure as record_branch_failure
from phasegate.branches import BranchPosition
from phasegate.door import Halt
from phasegate.door import settle as settle_door
from phasegate.envelope import MAIN_BRANCH, Envelope
from phasegate.store import RunPosition, Store
from phasegate.worker.outcomes import Action, Emit, PhaseLog, Settlement
from phasegate.worker.transition_config import TransitionConfig

log = structlog.get_logger("phasegate.transition")


class Failures:
    def __init__(self, *, store: Store, config: TransitionConfig, emit: Emit,
                 phase_log: PhaseLog, backoff: Callable[[int], int]) -> None:
        self.store = store
        self.config = config
        self._emit = emit
        self._phase_log = phase_log
        self._backoff = backoff

    async def fail(self, envelope: Envelope, phase_name: str, started: float,
                   exc: BaseException, *, retryable: bool) -> Settlement:
        # Type, fingerprint and frames only: a user exception's message may echo state.
        described = redact.describe(exc)
        error = described["error"]
        log.error("phase_error", phase=phase_name, retryable=retryable, **described)
        limit = self.config.max_attempts if retryable else 0
        if envelope.branch == MAIN_BRANCH:
            result = await self.store.record_failure(
                envelope.workflow_id, envelope.seq, error, limit, phase=phase_name,
                worker_id=self.config.worker_id)
        else:  # a failed branch may fan its fork in (phasegate/branch_failures.py)
            failure = await record_branch_failure(self.store, envelope, error, limit,
                                                  worker_id=self.config.worker_id)
            result = None if failure is None else (failure.attempts, failure.status)
            for row in failure.outbox if failure is not None else []:
                await self._emit(row)
        if result is None:
            self._phase_log(envelope, phase_name, started, "superseded")
            return Settlement(Action.DELETE, "superseded")
        attempts, status = result
        if status == "failed":
            self._phase_log(envelope, phase_name, started, "failed", attempts=attempts)
            return Settlement(Action.DELETE, "failed")
        delay = self._backoff(attempts)
        self._phase_log(envelope, phase_name, started, "retry", attempts=attempts,
                        retry_in_s=delay)
        return Settlement(Action.RELEASE, "retry", delay)

    async def halt(self, position: RunPosition, status: str, reason: str) -> Settlement:
        if isinstance(position, BranchPosition):
            await halt_branch(self.store, position, status, reason)
        else:
            await self.store.halt_run(position.workflow_id, position.next_seq, status, reason)
        log.warning("run_halted", status=status, reason=reason)
        return Settlement(Action.DELETE, status)

    async def halt_at_door(self, envelope: Envelope, position: RunPosition,
                           halt: Halt) -> Settlement:
        if isinstance(position, BranchPosition):  # the branch stops (branch_doors.py)
            for row in await halt_branch_at_door(self.store, envelope, position, halt):
                await self._emit(row)
        else:
            await settle_door(self.store, position, halt)
        log.warning("run_halted", status=halt.status, reason=halt.reason)
        return Settlement(Action.DELETE, halt.status)
