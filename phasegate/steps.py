"""Steps and delivery receipts: what makes the inside of a phase safe to replay.

A phase that crashes is run again from its door (the checkpoint before it). Whatever it did
with side effects before the crash must not happen twice, so side effects go through
``ctx.step`` and ``ctx.deliver``:

- every step gets a ``step_seq`` (1, 2, ... in call order) before it runs;
- a ``read`` step is simply run again on replay, unless ``cache=True`` (then its recorded
  output is returned);
- a ``write``/``execute`` step first commits a ``pre_execution`` record (one round trip), then
  calls its function with ``idempotency_key=`` the first 32 hex chars of
  sha256(``workflow_id:branch:seq:step_seq``), then commits ``completed`` with the output (one
  round trip). On replay a completed step returns its recorded output without calling the
  function; a step found in ``pre_execution`` is called again WITH THE SAME KEY, so the
  downstream deduplicates it;
- ``ctx.deliver(batch_id, artifact_id, fn)`` records a receipt per (workflow, batch,
  artifact) for the whole run; a resumed run skips deliveries already made, and
  ``ctx.pending(batch_ids)`` returns the batches not yet marked processed.

Outputs and receipts must be JSON: they are recorded and replayed, and the phase sees exactly
what a replay would see (a tuple comes back as a list either way).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import asyncpg
import structlog

from phasegate.db_errors import DATABASE_DOWN
from phasegate.envelope import canonical_json
from phasegate.faults import Faults
from phasegate.records import record
from phasegate.sql import queries
from phasegate.workflow import NonRetryableError

log = structlog.get_logger("phasegate.steps")

Category = Literal["read", "write", "execute"]
CATEGORIES: tuple[str, ...] = ("read", "write", "execute")
BATCH_MARKER = ""  # the artifact_id of the row that marks a whole batch as processed


class StepOutputError(NonRetryableError, TypeError):
    """A step's output (or a delivery's receipt) is not JSON, so it cannot be recorded."""


class StepMismatchError(NonRetryableError):
    """A replay met a different step at a recorded position: the phase's code changed, or it
    chose its steps from something that differs between attempts."""


@record
class StepScope:
    """Which phase attempt the steps belong to."""

    workflow_id: str
    branch: str
    seq: int
    worker_id: str | None = None


@dataclass(frozen=True)
class StepRecord:
    step_name: str
    category: str
    idempotency_key: str
    input_hash: str
    status: str  # pre_execution | completed
    output: str | None  # JSON text when completed


def idempotency_key(workflow_id: str, branch: str, seq: int, step_seq: int) -> str:
    """The key a write/execute step's function receives: stable across every replay."""
    raw = f"{workflow_id}:{branch}:{seq}:{step_seq}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def delivery_key(workflow_id: str, batch_id: str, artifact_id: str) -> str:
    """The key a delivery's function receives: one per (workflow, batch, artifact)."""
    raw = f"{workflow_id}:delivery:{batch_id}:{artifact_id}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def input_hash(args: tuple[Any, ...]) -> str:
    """sha256 of the arguments as JSON; what JSON cannot show is hashed by its type name."""
    text = json.dumps(list(args), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=lambda value: f"<{type(value).__qualname__}>")
    return hashlib.sha256(text.encode()).hexdigest()


def as_json(value: Any, what: str) -> tuple[str, Any]:
    """(canonical text, the value as a replay would return it) or a clear StepOutputError."""
    try:
        text = canonical_json(value)
    except (TypeError, ValueError) as exc:
        raise StepOutputError(
            f"{what} returned {type(value).__name__}, which is not JSON ({exc}); outputs are "
            "recorded and replayed, so return JSON data (dict, list, str, int, float, bool, "
            "None)") from None
    return text, json.loads(text)


async def _call(fn: Callable[..., Any], args: tuple[Any, ...], **kwargs: Any) -> Any:
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


class StepLedger(Protocol):
    """Where step records and receipts live: Postgres in the worker, memory in unit tests."""

    async def claim(self, scope: StepScope, step_seq: int, name: str, category: str,
                    key: str, in_hash: str) -> StepRecord: ...

    async def find(self, scope: StepScope, step_seq: int) -> StepRecord | None: ...

    async def complete(self, scope: StepScope, step_seq: int, output: str) -> None: ...

    async def record_completed(self, scope: StepScope, step_seq: int, name: str,
                               category: str, key: str, in_hash: str, output: str) -> None: ...

    async def receipt(self, workflow_id: str, batch_id: str,
                      artifact_id: str) -> str | None: ...

    async def record_receipt(self, scope: StepScope, batch_id: str, artifact_id: str,
                             key: str, receipt: str | None) -> None: ...

    async def done_batches(self, workflow_id: str, batch_ids: list[str]) -> set[str]: ...




class LedgerUnavailable(ConnectionError):
    """The database failed under a step record or receipt - phasegate's own bookkeeping, not
    the step's function. The transition hands the message back with a backoff and does NOT
    charge the phase's retry budget, as when the database is down at the door (found by
    bench/chaos: a database restart or a dropped connection during a step counted as a phase
    failure, so a few blips failed a healthy run)."""


class _StorePool:
    """The three pool calls the ledger makes, with database outages as LedgerUnavailable."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def fetchrow(self, query: str, *args: Any) -> Any:
        try:
            return await self._pool.fetchrow(query, *args)
        except DATABASE_DOWN as exc:
            raise LedgerUnavailable(f"step ledger: {type(exc).__name__}") from exc

    async def fetch(self, query: str, *args: Any) -> Any:
        try:
            return await self._pool.fetch(query, *args)
        except DATABASE_DOWN as exc:
            raise LedgerUnavailable(f"step ledger: {type(exc).__name__}") from exc

    async def execute(self, query: str, *args: Any) -> Any:
        try:
            return await self._pool.execute(query, *args)
        except DATABASE_DOWN as exc:
            raise LedgerUnavailable(f"step ledger: {type(exc).__name__}") from exc


class PostgresLedger:
    """Step records and receipts in PostgreSQL; every method is one round trip."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._db = _StorePool(pool)
        self._q = queries()

    async def claim(self, scope: StepScope, step_seq: int, name: str, category: str,
                    key: str, in_hash: str) -> StepRecord:
        row = await self._db.fetchrow(
            self._q["step_claim"], scope.workflow_id, scope.branch, scope.seq, step_seq, name,
            category, key, in_hash, scope.worker_id)
        if row is None:
            # A concurrent attempt inserted the row after this statement's snapshot was taken:
            # it is committed now, so read it.
            found = await self.find(scope, step_seq)
            assert found is not None, "step record vanished"
            return found
        return StepRecord(**dict(row))

    async def find(self, scope: StepScope, step_seq: int) -> StepRecord | None:
        row = await self._db.fetchrow(self._q["step_find"], scope.workflow_id, scope.branch,
                                       scope.seq, step_seq)
        return StepRecord(**dict(row)) if row else None

    async def complete(self, scope: StepScope, step_seq: int, output: str) -> None:
        await self._db.execute(self._q["step_complete"], scope.workflow_id, scope.branch,
                                scope.seq, step_seq, output)

    async def record_completed(self, scope: StepScope, step_seq: int, name: str,
                               category: str, key: str, in_hash: str, output: str) -> None:
        await self._db.execute(
            self._q["step_record_completed"], scope.workflow_id, scope.branch, scope.seq,
            step_seq, name, category, key, in_hash, output, scope.worker_id)

    async def receipt(self, workflow_id: str, batch_id: str, artifact_id: str) -> str | None:
        row = await self._db.fetchrow(self._q["delivery_find"], workflow_id, batch_id,
                                       artifact_id)
        return None if row is None else (row["receipt"] or "null")

    async def record_receipt(self, scope: StepScope, batch_id: str, artifact_id: str,
                             key: str, receipt: str | None) -> None:
        await self._db.execute(self._q["delivery_record"], scope.workflow_id, batch_id,
                                artifact_id, key, scope.seq, receipt, scope.worker_id)

    async def done_batches(self, workflow_id: str, batch_ids: list[str]) -> set[str]:
        rows = await self._db.fetch(self._q["delivery_done_batches"], workflow_id, batch_ids)
        return {row["batch_id"] for row in rows}


class MemoryLedger:
    """An in-memory ledger with the same semantics, for unit tests of workflows."""

    def __init__(self) -> None:
        self.steps: dict[tuple[str, str, int, int], StepRecord] = {}
        self.receipts: dict[tuple[str, str, str], str | None] = {}

    async def claim(self, scope: StepScope, step_seq: int, name: str, category: str,
                    key: str, in_hash: str) -> StepRecord:
        at = (scope.workflow_id, scope.branch, scope.seq, step_seq)
        return self.steps.setdefault(
            at, StepRecord(name, category, key, in_hash, "pre_execution", None))

    async def find(self, scope: StepScope, step_seq: int) -> StepRecord | None:
        return self.steps.get((scope.workflow_id, scope.branch, scope.seq, step_seq))

    async def complete(self, scope: StepScope, step_seq: int, output: str) -> None:
        at = (scope.workflow_id, scope.branch, scope.seq, step_seq)
        record = self.steps[at]
        if record.status == "pre_execution":
            self.steps[at] = StepRecord(record.step_name, record.category,
                                        record.idempotency_key, record.input_hash,
                                        "completed", output)

    async def record_completed(self, scope: StepScope, step_seq: int, name: str,
                               category: str, key: str, in_hash: str, output: str) -> None:
        self.steps.setdefault((scope.workflow_id, scope.branch, scope.seq, step_seq),
                              StepRecord(name, category, key, in_hash, "completed", output))

    async def receipt(self, workflow_id: str, batch_id: str, artifact_id: str) -> str | None:
        at = (workflow_id, batch_id, artifact_id)
        return (self.receipts[at] or "null") if at in self.receipts else None

    async def record_receipt(self, scope: StepScope, batch_id: str, artifact_id: str,
                             key: str, receipt: str | None) -> None:
        self.receipts.setdefault((scope.workflow_id, batch_id, artifact_id), receipt)

    async def done_batches(self, workflow_id: str, batch_ids: list[str]) -> set[str]:
        return {b for b in batch_ids if (workflow_id, b, BATCH_MARKER) in self.receipts}


class Steps:
    """The steps of one phase attempt: numbers them and runs the record protocol."""

    def __init__(self, ledger: StepLedger, scope: StepScope,
                 faults: Faults | None = None) -> None:
        self.ledger = ledger
        self.scope = scope
        self.faults = faults
        self.count = 0

    async def step(self, name: str, fn: Callable[..., Any], *args: Any,
                   category: Category = "read", cache: bool = False) -> Any:
        if category not in CATEGORIES:
            raise ValueError(f"step {name!r}: category must be one of {CATEGORIES}, "
                             f"not {category!r}")
        self.count += 1
        step_seq = self.count
        what = f"step {name!r} (step_seq {step_seq})"
        if category == "read":
            return await self._read(step_seq, name, fn, args, cache, what)
        key = idempotency_key(self.scope.workflow_id, self.scope.branch, self.scope.seq,
                              step_seq)
        in_hash = input_hash(args)
        record = await self.ledger.claim(self.scope, step_seq, name, category, key, in_hash)
        self._check_replay(record, name, category, in_hash, what)
        if record.status == "completed":
            log.debug("step_replayed", step=name, step_seq=step_seq)
            return json.loads(record.output or "null")
        # pre_execution: new, or left by an attempt that died. Same key either way.
        if self.faults is not None:
            self.faults.hit("step_claimed")  # TEST ONLY: recorded, the effect not yet made
        result = await _call(fn, args, idempotency_key=record.idempotency_key)
        text, value = as_json(result, what)
        if self.faults is not None:
            self.faults.hit("mid_phase")  # TEST ONLY: the effect happened, not yet recorded
            self.faults.hit("step_effect")
        await self.ledger.complete(self.scope, step_seq, text)
        return value

    async def _read(self, step_seq: int, name: str, fn: Callable[..., Any],
                    args: tuple[Any, ...], cache: bool, what: str) -> Any:
        if cache:
            record = await self.ledger.find(self.scope, step_seq)
            if record is not None:
                self._check_replay(record, name, "read", input_hash(args), what)
                return json.loads(record.output or "null")
        _, value = as_json(await _call(fn, args), what)
        if cache:
            key = idempotency_key(self.scope.workflow_id, self.scope.branch, self.scope.seq,
                                  step_seq)
            await self.ledger.record_completed(self.scope, step_seq, name, "read", key,
                                               input_hash(args), canonical_json(value))
        return value

    @staticmethod
    def _check_replay(record: StepRecord, name: str, category: str, in_hash: str,
                      what: str) -> None:
        if record.step_name != name or record.category != category:
            raise StepMismatchError(
                f"{what} is a {category} step, but an earlier attempt of this phase recorded "
                f"{record.category} step {record.step_name!r} at that position; steps must "
                "be called in the same order on every attempt")
        if record.input_hash != in_hash:
            log.warning("step_input_changed", step=name,
                        note="replaying the recorded step; its arguments differ this time")

    # -- deliveries ---------------------------------------------------------------------------

    async def deliver(self, batch_id: str, artifact_id: str, fn: Callable[..., Any],
                      *args: Any) -> Any:
        if not isinstance(batch_id, str) or not batch_id:
            raise ValueError("batch_id must be a non-empty string")
        if not isinstance(artifact_id, str) or artifact_id == BATCH_MARKER:
            raise ValueError("artifact_id must be a non-empty string")
        workflow_id = self.scope.workflow_id
        recorded = await self.ledger.receipt(workflow_id, batch_id, artifact_id)
        if recorded is not None:
            log.debug("delivery_skipped", batch_id=batch_id, artifact_id=artifact_id)
            return json.loads(recorded)
        key = delivery_key(workflow_id, batch_id, artifact_id)
        result = await _call(fn, args, idempotency_key=key)
        text, value = as_json(result, f"delivery {batch_id}/{artifact_id}")
        await self.ledger.record_receipt(self.scope, batch_id, artifact_id, key, text)
        return value

    async def pending(self, batch_ids: Iterable[str]) -> list[str]:
        wanted = list(dict.fromkeys(batch_ids))
        done = await self.ledger.done_batches(self.scope.workflow_id, wanted) if wanted else set()
        return [b for b in wanted if b not in done]

    async def batch_done(self, batch_id: str) -> None:
        if not isinstance(batch_id, str) or not batch_id:
            raise ValueError("batch_id must be a non-empty string")
        key = delivery_key(self.scope.workflow_id, batch_id, BATCH_MARKER)
        await self.ledger.record_receipt(self.scope, batch_id, BATCH_MARKER, key, None)
