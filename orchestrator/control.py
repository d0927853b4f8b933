"""Steering runs: start, cancel, retry, restart, approve, reject. Shared by the API and CLI.

Each action reads the run, decides (a wrong state is a ``Conflict`` with a reason), then
writes in ONE statement conditional on the run still being exactly as read: the run row, the
outbox row that resumes it and a ``control_actions`` row. Only then is the message sent; if
the send fails, the relay sends it. A run that changed in between is read again.

Resuming bumps the run's ``epoch``; the message's deduplication id includes it, so SQS's
5-minute deduplication window cannot swallow the message that resumes a run whose original
message for the same seq was sent moments ago.

Approve and reject are review decisions: signals (``phasegate.approve``/``phasegate.reject``)
sent through phasegate/signals.py, which writes the same run row, outbox row and
``control_actions`` row in its transaction. Sent with an idempotency key, a decision is made
once: a retry of the key gets the first answer back (the same action, run and ``sent``, kept
with the signal, migration 0019) instead of a 409 from the run having moved on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import structlog

from phasegate.access import ReadPolicy
from phasegate.envelope import dedup_id, message_group_id, phase_message
from phasegate.orchestrator.starter import StartError, start_workflow
from phasegate.orchestrator.views import Conflict, Invalid, NotFound, Run, Views, run_from_row
from phasegate.queue import Outgoing, Queue
from phasegate.residency import DEFAULT_REGION, RegionalStore, StoreRouter
from phasegate.signals import (
    ACTIONS,
    NotUnderReview,
    RunFinished,
    RunNotFound,
    SignalError,
    SignalResult,
    check_idempotency_key,
    send_decision,
    send_signal,
)
from phasegate.sql import queries
from phasegate.store import Store
from phasegate.workflow import Registry

log = structlog.get_logger("phasegate.control")

CANCELLABLE = ("pending", "running", "awaiting_review", "failed", "needs_restart", "queued",
               "waiting")
# A run that changes under an action this many times in a row is reported as a conflict.
MAX_RACES = 5
REASON_LIMIT = 1000
# A retry that finds its key's decision still finishing (the first request has not kept its
# answer yet) waits this long for that answer, then answers from the run as it is now.
REPLAY_WAIT_S = 5.0
REPLAY_POLL_S = 0.05


def check_decision_key(key: str | None) -> None:
    """Refuse (422) a decision's key outside the rule (phasegate/signals.py) before it is
    looked up; the API's routes refuse it before they get here, the CLI's path does not."""
    try:
        check_idempotency_key(key)
    except SignalError as exc:
        raise Invalid(str(exc)) from None


@dataclass(frozen=True)
class Outcome:
    """What an action did: the run as it is now, and whether its message reached SQS."""

    run: Run
    action: str
    sent: bool | None = None
    # The first answer to a decision's idempotency key, given again (nothing changed).
    replayed: bool = False

    def to_json(self) -> str:
        return json.dumps({"action": self.action, "sent": self.sent,
                           "run": self.run.model_dump(mode="json")})

    @classmethod
    def replay(cls, stored: str) -> Outcome:
        kept = json.loads(stored)
        return cls(Run.model_validate(kept["run"]), kept["action"], kept["sent"], True)


@dataclass(frozen=True)
class Rule:
    action: str
    allowed: tuple[str, ...]
    hint: str


RULES = {
    "retry": Rule("retry", ("failed",), "retry resumes a failed run from its last checkpoint"),
    "restart": Rule("restart", ("needs_restart",),
                    "restart starts a needs_restart run again from its input"),
    "approve": Rule("approve", ("awaiting_review",), "approve continues a run under review"),
    "reject": Rule("reject", ("awaiting_review",), "reject re-runs the phase under review"),
    "cancel": Rule("cancel", CANCELLABLE, "finished runs cannot be cancelled"),
}
# A redrive of a quarantined message (orchestrator/quarantine.py) resends the run's current
# phase, rebuilt from the run row; it is logged as a retry (control_actions knows no other
# word for "resume from the last checkpoint").
REDRIVE = Rule("retry", ("failed", "running"),
               "a redrive resends the current phase of a failed or running run")


def refuse(rule: Rule, run: Run) -> Conflict:
    return Conflict(f"cannot {rule.action} run {run.workflow_id}: its status is "
                    f"{run.status!r}, {rule.action} needs {' or '.join(rule.allowed)} "
                    f"({rule.hint})")


class Control:
    """The write side of the control plane. ``queue`` may be None (the relay then sends)."""

    def __init__(self, pool: asyncpg.Pool, queue: Queue | None, registry: Registry | None,
                 *, actor: str | None = None, read_policy: ReadPolicy | None = None,
                 stores: StoreRouter | None = None,
                 mark_sent: Callable[[int], None] | None = None) -> None:
        self.pool = pool
        self.queue = queue
        self.registry = registry or Registry()
        self.actor = actor
        self.read_policy = read_policy
        self.views = Views(pool, policy=read_policy, actor=actor)
        # Starts are checked against the store's region (docs/concepts/governance.md); with several
        # stores, runs are found in the store that holds them (``scoped``).
        self.stores = stores
        self.store: Store = stores if stores is not None else RegionalStore(pool)
        self._scoped: dict[str, Control] = {}
        self._q = queries("control.sql")
        # Outbox rows of messages this control plane sent, marked by a batch of the
        # orchestrator's rather than in the request (``start_workflow``). One store only: the
        # batch's task does not know which store a request was routed to.
        self.mark_sent = mark_sent if stores is None else None

    def acting_as(self, actor: str) -> Control:
        """This control plane with ``actor`` recorded on its actions and reads (the API's
        caller: the token's name)."""
        if actor == self.actor:
            return self
        return Control(self.pool, self.queue, self.registry, actor=actor,
                       read_policy=self.read_policy, stores=self.stores,
                       mark_sent=self.mark_sent)

    def in_store(self, store: RegionalStore) -> Control:
        """This control plane over one regional store (the default store: itself)."""
        if store.region == DEFAULT_REGION:
            return self
        if store.region not in self._scoped:
            self._scoped[store.region] = Control(
                store.pool, self.queue, self.registry, actor=self.actor,
                read_policy=self.read_policy)
        return self._scoped[store.region]

    async def scoped(self, workflow_id: str) -> Control:
        """The control plane of the store that holds ``workflow_id`` (NotFound: none)."""
        if self.stores is None:
            return self
        store = await self.stores.locate(workflow_id)
        if store is None:
            raise NotFound(f"no workflow run with id {workflow_id!r}")
        return self.in_store(store)

    # -- start --------------------------------------------------------------------------------

    async def start(self, workflow_name: str, input: Any, workflow_id: str | None = None, *,
                    classification: str | None = None,
                    region: str | None = None) -> tuple[Run, bool]:
        """Start a run (idempotent on ``workflow_id``). Returns the run and whether it is new.
        ``classification``/``region`` fix its store; an unknown region is refused (422)."""
        workflow = self.registry.get(workflow_name)
        if workflow is None:
            raise Invalid(f"unknown workflow {workflow_name!r}; this orchestrator loads "
                          f"{self.registry.names()} (PHASEGATE_WORKFLOW_MODULES)")
        if self.queue is None:
            raise Conflict("starting runs needs PHASEGATE_QUEUE_URL")
        try:
            started = await start_workflow(self.store, self.queue, workflow=workflow,
                                           input=input, workflow_id=workflow_id,
                                           classification=classification, region=region,
                                           mark_sent=self.mark_sent)
        except StartError as exc:
            raise Invalid(str(exc)) from None
        if started.run is not None:  # created: the run as its insert returned it
            return run_from_row(started.run), True
        views = self.views
        if self.stores is not None:
            views = self.in_store(self.stores.for_region(region)).views
        run = await views.get_run(started.workflow_id)
        if not started.created and run.workflow != workflow.name:
            raise Conflict(f"id {run.workflow_id!r} already belongs to a run of workflow "
                           f"{run.workflow!r}")
        return run, started.created

    # -- the state transitions ------------------------------------------------------------------

    async def cancel(self, workflow_id: str, reason: str | None = None) -> Outcome:
        rule = RULES["cancel"]
        for _ in range(MAX_RACES):
            run = await self.views.get_run(workflow_id)
            if run.status not in rule.allowed:
                raise refuse(rule, run)
            done = await self.pool.fetchval(self._q["cancel_run"], workflow_id, run.status,
                                            _clip(reason), self.actor)
            if done is not None:
                log.info("run_cancelled", workflow_id=workflow_id, from_status=run.status)
                return Outcome(await self.views.get_run(workflow_id), "cancel")
        raise Conflict(f"run {workflow_id} kept changing; try again")

    async def retry(self, workflow_id: str, reason: str | None = None) -> Outcome:
        return await self._resume(RULES["retry"], workflow_id, reason)

    async def restart(self, workflow_id: str, reason: str | None = None) -> Outcome:
        return await self._resume(RULES["restart"], workflow_id, reason)

    async def approve(self, workflow_id: str, reason: str | None = None, *,
                      idempotency_key: str | None = None) -> Outcome:
        """Continue a run under review. With ``idempotency_key``, a repeat returns the first
        answer (``replayed``) and changes nothing."""
        return await self._decide(RULES["approve"], workflow_id, reason, idempotency_key)

    async def reject(self, workflow_id: str, reason: str | None = None, *,
                     idempotency_key: str | None = None) -> Outcome:
        """Re-run the phase under review; ``idempotency_key`` as for ``approve``."""
        return await self._decide(RULES["reject"], workflow_id, reason, idempotency_key)

    async def redrive(self, workflow_id: str, reason: str | None = None) -> Outcome:
        return await self._resume(REDRIVE, workflow_id, reason)

    async def _resume(self, rule: Rule, workflow_id: str, reason: str | None) -> Outcome:
        for _ in range(MAX_RACES):
            run = await self.views.get_run(workflow_id)
            if run.status not in rule.allowed:
                raise refuse(rule, run)
            phase, schema_version = self._resume_point(rule, run)
            epoch = run.epoch + 1
            message = phase_message(workflow_id, run.workflow, run.seq, phase)
            if run.region is not None:  # the worker routes it to the run's store
                message = message.model_copy(update={"region": run.region})
            dedup = dedup_id(workflow_id, message.branch, run.seq, epoch)
            outbox_id = await self.pool.fetchval(
                self._q["resume_run"], workflow_id, run.status, run.seq, run.epoch, phase,
                rule.action == "restart", schema_version, dedup,
                message_group_id(workflow_id, message.branch), message.to_json(), rule.action,
                _clip(reason), self.actor)
            if outbox_id is None:
                continue  # the run changed since we read it: decide again
            sent = await self._send(outbox_id, message.to_json(), message.group_id, dedup)
            log.info("run_resumed", workflow_id=workflow_id, action=rule.action,
                     from_status=run.status, seq=run.seq, epoch=epoch, sent=sent)
            return Outcome(await self.views.get_run(workflow_id), rule.action, sent)
        raise Conflict(f"run {workflow_id} kept changing; try again")

    async def _decide(self, rule: Rule, workflow_id: str, reason: str | None,
                      key: str | None = None) -> Outcome:
        """approve/reject: the review's decision signal (phasegate/signals.py)."""
        check_decision_key(key)
        for _ in range(MAX_RACES):
            run = await self.views.get_run(workflow_id)
            if run.status not in rule.allowed:
                # A retry of a decided key finds the run moved on: the first answer, not 409.
                first = await self._first_answer(workflow_id, key) if key else None
                if first is not None:
                    return first
                raise refuse(rule, run)
            self._resume_point(rule, run)  # a run with no current phase: a clear Conflict
            try:
                result = await send_decision(self.pool, workflow_id, rule.action,
                                             _clip(reason), idempotency_key=key,
                                             queue=self.queue, actor=self.actor)
            except (NotUnderReview, RunFinished):
                continue  # the run changed since we read it: decide again
            except RunNotFound as exc:
                raise NotFound(str(exc)) from None
            if key is not None and result.duplicate:
                # The key's decision was made first (under the run's lock): its answer.
                first = await self._first_answer(workflow_id, key)
                if first is not None:
                    return first
                continue
            log.info("run_resumed", workflow_id=workflow_id, action=rule.action,
                     from_status=run.status, seq=run.seq, epoch=run.epoch + 1,
                     sent=result.sent)
            outcome = Outcome(await self.views.get_run(workflow_id), rule.action, result.sent)
            if key is not None:
                await self.pool.execute(self._q["keep_decision_outcome"], result.signal_id,
                                        outcome.to_json())
            return outcome
        raise Conflict(f"run {workflow_id} kept changing; try again")

    async def _first_answer(self, workflow_id: str, key: str) -> Outcome | None:
        """The answer the first request with ``key`` got; None: no decision has this key.
        One still finishing is waited for (briefly); one never kept (that request died
        before answering) is answered from the run as it is now."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPLAY_WAIT_S
        while True:
            row = await self.pool.fetchrow(self._q["decision_by_key"], workflow_id, key)
            if row is None:
                return None
            if row["name"] not in ACTIONS:
                raise Conflict("this idempotency key was used for a signal to run "
                               f"{workflow_id}, not for a review decision")
            if row["outcome"] is not None:
                return Outcome.replay(row["outcome"])
            if loop.time() >= deadline:
                return Outcome(await self.views.get_run(workflow_id), ACTIONS[row["name"]],
                               None, replayed=True)
            await asyncio.sleep(REPLAY_POLL_S)

    def _resume_point(self, rule: Rule, run: Run) -> tuple[str, int | None]:
        """The phase the resuming message names, and the schema version to set (restart)."""
        if rule.action == "restart":
            workflow = self.registry.get(run.workflow)
            if workflow is None:
                raise Conflict(f"cannot restart run {run.workflow_id}: workflow "
                               f"{run.workflow!r} is not loaded here (PHASEGATE_WORKFLOW_MODULES"
                               f" = {self.registry.names()}), so its first phase is unknown")
            return workflow.first_phase, workflow.schema_version
        if run.current_phase is None:
            raise Conflict(f"cannot {rule.action} run {run.workflow_id}: it has no current phase")
        return run.current_phase, None

    async def _send(self, outbox_id: int, body: str, group_id: str, dedup: str) -> bool:
        if self.queue is None:
            return False
        try:
            await self.queue.send([Outgoing(body, group_id, dedup)])
        except Exception as exc:
            log.warning("control_send_failed_relay_will_send", error=type(exc).__name__)
            return False
        if self.mark_sent is not None:
            self.mark_sent(outbox_id)
        else:
            await self.store.mark_sent([outbox_id])
        return True


    # -- signals (phasegate/signals.py) --------------------------------------------------------

    async def signal(self, workflow_id: str, name: str, payload: Any,
                     idempotency_key: str | None = None) -> SignalResult:
        """Send signal ``name`` to the run; a woken run's message is sent at once. A bad
        name, key or payload is ``Invalid`` (send_signal's rules)."""
        try:
            result = await send_signal(self.pool, workflow_id, name, payload,
                                       idempotency_key=idempotency_key, queue=self.queue,
                                       actor=self.actor)
        except RunNotFound as exc:
            raise NotFound(str(exc)) from None
        except RunFinished as exc:
            raise Conflict(str(exc)) from None
        except SignalError as exc:
            raise Invalid(str(exc)) from None
        log.info("signal_received", workflow_id=workflow_id, delivered=result.delivered,
                 duplicate=result.duplicate, sent=result.sent)
        return result

    # -- branches (orchestrator/branching.py) ------------------------------------------------

    async def merge(self, workflow_id: str, branch: str, reason: str | None = None) -> Outcome:
        """Supervisor merge: promote ``branch``'s state to the main chain at the merge seq."""
        from phasegate.orchestrator.branching import supervisor_merge

        sent = await supervisor_merge(self.pool, self.queue, workflow_id, branch, _clip(reason),
                                      self.actor)
        return Outcome(await self.views.get_run(workflow_id), "merge", sent)

    async def branches(self, workflow_id: str) -> list[dict[str, Any]]:
        """The run's forks and branches (``phasegate inspect --tree``)."""
        from phasegate.orchestrator.branching import branch_tree

        await self.views.get_run(workflow_id)
        return await branch_tree(self.pool, workflow_id)


def _clip(reason: str | None) -> str | None:
    return reason[:REASON_LIMIT] if reason else None


__all__ = ["CANCELLABLE", "RULES", "Conflict", "Control", "Invalid", "NotFound", "Outcome"]
