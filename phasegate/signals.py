"""Sending a signal to a run: ``POST /v1/workflows/{id}/signals/{name}``, ``phasegate signal``
and ``phasegate.send_signal`` all come here.

A signal is stored with its run. If the run is waiting for that name (``ctx.wait_for_signal``)
and the wait has not timed out, the same transaction makes the waiting outbox row due now and
hands the signal to the next phase (``ctx.signal``). Otherwise it is kept: a later wait for
its name takes it at its commit (phasegate/sql/queries.sql ``commit_phase``). A repeat of an
idempotency key changes nothing. Kept signals are deleted with their run (``phasegate purge``).

Review decisions take the same path (``send_decision``: ``phasegate approve|reject``, the API's
``POST .../approve|reject``, the console, ``phasegate.client`` through ``Control``): a run at
``awaiting_review`` waits for the reserved signal ``phasegate.approve`` or ``phasegate.reject``,
whose payload is the operator's reason. Under the same lock and idempotency rule, the signal
is delivered to the run's next seq under a new epoch, with the message that resumes the run
and the ``control_actions`` row (signals.sql ``decide``); the next phase's door reads it
(phasegate/door.py). Unlike a user signal a decision is never kept for later: it answers the
review the run is in, so a run not awaiting review refuses it (409).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import asyncpg

from phasegate.envelope import canonical_json, dedup_id, message_group_id, phase_message
from phasegate.queue import Outgoing, Queue
from phasegate.sql import queries
from phasegate.storable import check_storable
from phasegate.waits import check_signal_name

FINISHED = ("completed", "failed", "cancelled")
# An idempotency key of a signal or a review decision, however it arrives (this module's
# callers, the API's header and body, the CLI): visible ASCII, what an HTTP header carries
# unchanged through proxies (no control character, no newline), and no longer than the
# signals table's key column that both share. The API's 422 and this module's SignalError
# state the same rule in words.
MAX_KEY_CHARS = 200
IDEMPOTENCY_KEY_PATTERN = rf"^[!-~]{{1,{MAX_KEY_CHARS}}}$"
IDEMPOTENCY_KEY_RULE = (f"an idempotency key is 1-{MAX_KEY_CHARS} visible ASCII characters "
                        "(no spaces)")
# The review decisions, by the action that sends them (waits.RESERVED_PREFIX).
DECISIONS = {"approve": "phasegate.approve", "reject": "phasegate.reject"}
ACTIONS = {name: action for action, name in DECISIONS.items()}


class SignalError(Exception):
    """A signal refused; ``status_code`` is the HTTP status the API answers with."""

    status_code = 422


class RunNotFound(SignalError):
    status_code = 404


class RunFinished(SignalError):
    status_code = 409


class NotUnderReview(SignalError):
    """A review decision for a run that is not (or no longer) awaiting review."""

    status_code = 409


def check_idempotency_key(key: str | None) -> None:
    """Refuse (``SignalError``, 422) a key outside ``IDEMPOTENCY_KEY_PATTERN``."""
    if key is not None and re.fullmatch(IDEMPOTENCY_KEY_PATTERN, key) is None:
        raise SignalError(IDEMPOTENCY_KEY_RULE)


@dataclass(frozen=True)
class SignalResult:
    """``delivered``: it woke a waiting run (its next phase gets the payload); ``duplicate``:
    its idempotency key was seen before and nothing changed; neither: kept for a later wait.
    ``sent``: the woken run's message reached SQS (False: the relay sends it)."""

    workflow_id: str
    name: str
    signal_id: int
    delivered: bool
    duplicate: bool = False
    sent: bool = False


async def send_signal(pool: asyncpg.Pool, workflow_id: str, name: str, payload: Any = None, *,
                      idempotency_key: str | None = None, queue: Queue | None = None,
                      actor: str | None = None) -> SignalResult:
    """Send signal ``name`` with a JSON ``payload`` to run ``workflow_id``.

    Raises ``RunNotFound`` (no such run), ``RunFinished`` (it ended), ``SignalError`` (a bad
    name, key or payload: ``UnstorableValue`` rules). With a ``queue``, a woken run's message
    is sent at once; without one, the orchestrator's relay sends it within its interval."""
    try:
        check_signal_name(name)
    except ValueError as exc:
        raise SignalError(str(exc)) from None
    check_idempotency_key(idempotency_key)
    try:
        check_storable(payload, where="payload")
        body = canonical_json(payload)
    except (ValueError, TypeError) as exc:
        raise SignalError(str(exc)) from None
    return await _deliver(pool, workflow_id, name, body, idempotency_key, queue, actor)


async def send_decision(pool: asyncpg.Pool, workflow_id: str, action: str,
                        reason: str | None = None, *, idempotency_key: str | None = None,
                        queue: Queue | None = None, actor: str | None = None) -> SignalResult:
    """Decide the review of run ``workflow_id``: ``action`` is ``approve`` or ``reject``.

    Raises ``RunNotFound``, ``RunFinished``, ``NotUnderReview`` (the run is not awaiting
    review), ``SignalError`` (a bad idempotency key). A repeat of an idempotency key returns
    the first decision (``duplicate``) and changes nothing."""
    if action not in DECISIONS:
        raise SignalError(f"a review decision is one of {sorted(DECISIONS)}, not {action!r}")
    check_idempotency_key(idempotency_key)
    try:
        check_storable(reason, where="reason")
    except (ValueError, TypeError) as exc:
        raise SignalError(str(exc)) from None
    body = canonical_json({"reason": reason})
    return await _deliver(pool, workflow_id, DECISIONS[action], body, idempotency_key, queue,
                          actor, reason)


async def _deliver(pool: asyncpg.Pool, workflow_id: str, name: str, body: str,
                   key: str | None, queue: Queue | None, actor: str | None,
                   reason: str | None = None) -> SignalResult:
    result, row = await _store(pool, workflow_id, name, body, key, actor, reason)
    if row is not None and queue is not None:
        result = await _send(pool, queue, result, row)
    return result


async def _store(pool: asyncpg.Pool, workflow_id: str, name: str, body: str, key: str | None,
                 actor: str | None, reason: str | None
                 ) -> tuple[SignalResult, asyncpg.Record | None]:
    q = queries("signals.sql")
    async with pool.acquire() as connection, connection.transaction():
        run = await connection.fetchrow(q["lock_run"], workflow_id)
        if run is None:
            raise RunNotFound(f"no workflow run with id {workflow_id!r}")
        if key is not None:
            seen = await connection.fetchrow(q["find_by_key"], workflow_id, key)
            if seen is not None:
                return SignalResult(workflow_id, name, seen["signal_id"],
                                    seen["consumed_seq"] is not None, duplicate=True), None
        if run["status"] in FINISHED:
            raise RunFinished(f"run {workflow_id} is {run['status']}: it takes no more signals")
        if name in ACTIONS:
            row = await _decide(connection, workflow_id, run, name, body, key, actor, reason)
            return SignalResult(workflow_id, name, row["signal_id"], True), row
        row = None
        if run["status"] == "waiting" and run["waiting_for"] == name and run["before_due"]:
            row = await connection.fetchrow(q["wake"], workflow_id, run["next_seq"])
        if row is not None:
            await connection.execute(q["woken_run"], workflow_id)
        signal_id = await connection.fetchval(
            q["insert"], workflow_id, name, body, key,
            run["next_seq"] if row is not None else None, actor)
        if signal_id is None:  # impossible under the run's lock; refuse rather than guess
            raise SignalError("a signal with this idempotency key was stored concurrently")
        return SignalResult(workflow_id, name, signal_id, row is not None), row


async def _decide(connection: asyncpg.Connection, workflow_id: str, run: asyncpg.Record,
                  name: str, body: str, key: str | None, actor: str | None,
                  reason: str | None) -> asyncpg.Record:
    """The review wait ends: the decision delivered with the message that resumes the run."""
    if run["status"] != "awaiting_review" or run["current_phase"] is None:
        raise NotUnderReview(f"run {workflow_id} is {run['status']}, not awaiting_review")
    seq, epoch = run["next_seq"], run["epoch"] + 1
    message = phase_message(workflow_id, run["workflow"], seq, run["current_phase"])
    if run["region"] is not None:  # the worker routes it to the run's store
        message = message.model_copy(update={"region": run["region"]})
    row = await connection.fetchrow(
        queries("signals.sql")["decide"], workflow_id, seq, run["epoch"],
        dedup_id(workflow_id, message.branch, seq, epoch),
        message_group_id(workflow_id, message.branch), message.to_json(), name, body, key,
        actor, ACTIONS[name], reason)
    if row is None:  # impossible under the run's lock; refuse rather than guess
        raise NotUnderReview(f"run {workflow_id} changed while it was being decided")
    return row


async def _send(pool: asyncpg.Pool, queue: Queue, result: SignalResult,
                row: asyncpg.Record) -> SignalResult:
    try:
        await queue.send([Outgoing(row["body"], row["group_id"], row["dedup_id"])])
    except Exception:  # the row is due: the relay sends it on its next round
        return result
    await pool.execute(queries()["mark_sent"], [row["outbox_id"]])
    return SignalResult(result.workflow_id, result.name, result.signal_id, True, sent=True)


async def list_signals(pool: asyncpg.Pool, workflow_id: str) -> list[dict[str, Any]]:
    """The run's signals (never their payloads): what ``phasegate inspect`` shows."""
    rows = await pool.fetch(queries("signals.sql")["list"], workflow_id)
    return [dict(r) for r in rows]
