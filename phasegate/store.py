"""The checkpoint store: every read and write phasegate makes to PostgreSQL.

Postgres is the source of truth. Each method is one named query from ``sql/queries.sql`` and
one round trip; the phase commit is a single CTE statement, so it is atomic on its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from json.encoder import encode_basestring
from typing import Any

import asyncpg

from phasegate.db import create_pool
from phasegate.envelope import MAIN_BRANCH, Envelope, canonical_json, state_hash
from phasegate.group_commit import GroupCommit
from phasegate.records import record
from phasegate.sql import queries

__all__ = ["ChainLease", "Lease", "OutboxRow", "PhaseCommit", "RunPosition", "Store",
           "StoreError", "create_pool"]


class StoreError(Exception):
    """The store refused an operation (bad data), as opposed to the database being down."""


@record
class RunPosition:
    """What a worker needs to decide about one message, loaded in one round trip."""

    workflow_id: str
    workflow: str
    status: str
    next_seq: int
    base_seq: int
    current_phase: str | None
    schema_version: int
    input_json: str | None
    attempts: int
    epoch: int
    state_json: str | None
    state_hash: str | None
    state_version: int | None
    progress_json: str | None
    # Data residency (phasegate/residency.py): fixed at start.
    classification: str = "internal"
    region: str | None = None
    # The payload (JSON text) of the signal delivered to this seq (phasegate/waits.py).
    signal_json: str | None = None

    # The two copies a hop makes, built field by field: ``dataclasses.replace`` walks the
    # fields and costs twice as much, once or twice on every transition.

    def after(self, commit: PhaseCommit) -> RunPosition:
        """The position ``commit`` leaves when it advances the run from this one: running at
        the next seq and phase, no attempts, the committed state, nothing delivered yet."""
        assert commit.next_phase is not None
        return RunPosition(
            workflow_id=self.workflow_id, workflow=self.workflow, status="running",
            next_seq=commit.seq + 1, base_seq=self.base_seq, current_phase=commit.next_phase,
            schema_version=self.schema_version, input_json=self.input_json, attempts=0,
            epoch=self.epoch, state_json=commit.state_json, state_hash=commit.state_hash,
            state_version=commit.schema_version, progress_json=None,
            classification=self.classification, region=self.region, signal_json=None)

    def without_state(self) -> RunPosition:
        """This position without what the next commit replaces (state, progress, signal)."""
        return RunPosition(
            workflow_id=self.workflow_id, workflow=self.workflow, status=self.status,
            next_seq=self.next_seq, base_seq=self.base_seq, current_phase=self.current_phase,
            schema_version=self.schema_version, input_json=self.input_json,
            attempts=self.attempts, epoch=self.epoch, state_json=None, state_hash=None,
            state_version=self.state_version, progress_json=None,
            classification=self.classification, region=self.region, signal_json=None)


def position_fields(row: asyncpg.Record) -> dict[str, Any]:
    """The columns every read of a position returns (``load_for_phase``'s, a branch's
    ``load_branch``), by ``RunPosition`` field."""
    return {"workflow_id": row["workflow_id"], "workflow": row["workflow"],
            "status": row["status"], "next_seq": row["next_seq"], "base_seq": row["base_seq"],
            "current_phase": row["current_phase"], "schema_version": row["schema_version"],
            "input_json": row["input"], "attempts": row["attempts"], "epoch": row["epoch"],
            "state_json": row["state"], "state_hash": row["state_hash"],
            "state_version": row["state_version"], "progress_json": row["progress"]}


def position_from(row: asyncpg.Record) -> RunPosition:
    """A row of ``load_for_phase`` (or of a statement returning its columns) as a position."""
    return RunPosition(**position_fields(row), classification=row["classification"],
                       region=row["region"], signal_json=row["signal"])


@dataclass(frozen=True)
class Slot:
    """What a keyed workflow's start asks of its key (``phasegate_take_slot``): the key, the
    limits, and the message that wakes the run if it has to wait for admission. ``key``
    None: the key the run already has (a message without the input; ``start_keyed``)."""

    key: str | None
    limit: int | None
    dedup_id: str
    group_id: str
    body: str
    rate: int | None
    window_s: float | None


@dataclass(frozen=True)
class OutboxRow:
    outbox_id: int
    dedup_id: str
    group_id: str
    body: str
    sent_at: datetime | None = None
    # A live lease (database time): a continuing worker or a relay takes care of the row.
    leased: bool = False


@dataclass(frozen=True)
class CreatedRun:
    """A run ``start_run`` (or ``start_keyed_run``) created: its start message's outbox row
    (None: queued under its key, its admission writes the message), and the run as created
    (the columns of control.sql's ``get_run``)."""

    outbox_id: int | None
    run: dict[str, Any]


def created_run(row: asyncpg.Record) -> CreatedRun:
    run = dict(row)
    return CreatedRun(run.pop("outbox_id"), run)


# Marks a leased send's lease holder (worker/continuation.py): a worker id never contains a
# '/' (settings.py), so the lease tells a sent message from a chain running in its worker.
SENT_SUFFIX = "/sent"


@dataclass(frozen=True)
class ChainLease:
    """A run some worker runs locally (a chain lease on its position, migration 0020), and
    what the message of its next phase is made of, should it have to be rebuilt."""

    workflow_id: str
    workflow: str
    next_seq: int
    current_phase: str | None
    chain_traceparent: str | None
    region: str | None
    live: bool
    holder: str | None = None

    @property
    def sent(self) -> bool:
        """A leased send's lease (``SENT_SUFFIX``): its message went out, or its
        worker died before the send; no worker runs the phase locally."""
        return self.holder is not None and self.holder.endswith(SENT_SUFFIX)


@dataclass(frozen=True)
class Lease:
    """Who holds an outbox row and for how long from now (database time)."""

    holder: str
    seconds: float


@record
class PhaseCommit:
    """Everything the one commit statement writes."""

    workflow_id: str
    branch: str
    seq: int
    phase: str
    schema_version: int
    state_json: str
    state_hash: str
    next_phase: str | None
    status: str
    worker_id: str
    successor: Envelope | None = None
    tier: int | None = None
    tier_label: str | None = None
    resource_versions_json: str | None = None
    trace_id: str | None = None
    # Set only when the phase did not simply advance (see phasegate/tiers.py).
    outcome: str | None = None
    rerun_of: int | None = None
    error: str | None = None
    review_json: str | None = None
    # A wait before the successor (phasegate/waits.py): all None for a plain advance.
    wait_s: float | None = None
    wait_until: datetime | None = None
    wait_signal: str | None = None


class Store:
    """Typed access to the phasegate tables over an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool, *, commit_window_s: float = 0.0,
                 load_window_s: float = 0.0) -> None:
        self.pool = pool
        self._q = queries()
        # PHASEGATE_COMMIT_BATCH_WINDOW_MS: concurrent commits share a statement (0: off).
        self.group_commit: GroupCommit | None = None
        if commit_window_s > 0:
            self.group_commit = GroupCommit(
                pool, single_sql=self._q["commit_phase"], batch_sql=self._q["commit_phases"],
                window_s=commit_window_s,
                batch_alone={self._q["continue_phase"]: self._q["continue_phases"]})
        # PHASEGATE_LOAD_BATCH_WINDOW_MS: concurrent checks share a read (0: off).
        self.group_load: GroupCommit | None = None
        if load_window_s > 0:
            self.group_load = GroupCommit(
                pool, single_sql=self._q["load_for_phase"], batch_sql=self._q["load_for_phases"],
                window_s=load_window_s, name="load", lone_in_caller=True)

    async def ping(self) -> None:
        await self.pool.fetchval(queries("schema.sql")["ping"])

    # -- runs

    async def start_and_load(self, envelope: Envelope, schema_version: int, first_phase: str,
                             classification: str = "internal", region: str | None = None
                             ) -> RunPosition | None:
        """A start message's run created if a producer only enqueued it (queries.sql's
        ``ensure_run``), then loaded as ``load_for_phase`` loads it, in one round trip
        (migration 0032). Not shared with concurrent loads: a start is one per run."""
        row = await self.pool.fetchrow(
            self._q["start_and_load"], envelope.workflow_id, envelope.workflow, schema_version,
            canonical_json(envelope.input), first_phase, classification, region, envelope.seq)
        return None if row is None else position_from(row)

    async def start_keyed(self, envelope: Envelope, schema_version: int, first_phase: str,
                          slot: Slot, classification: str = "internal",
                          region: str | None = None) -> tuple[str | None, RunPosition | None]:
        """A keyed workflow's start: its run created as ``start_and_load`` creates it, its slot
        taken (``phasegate_take_slot``) and, unless it was queued, the run loaded as
        ``load_for_phase`` loads it, in one round trip (migration 0034). The run's status
        after the slot's decision (None if the run does not exist) and its position (None
        when queued or not found)."""
        row = await self.pool.fetchrow(
            self._q["start_keyed_and_load"], envelope.workflow_id, envelope.workflow,
            schema_version, canonical_json(envelope.input), first_phase, classification,
            region, slot.key, slot.limit, slot.dedup_id, slot.group_id, slot.body, slot.rate,
            slot.window_s, envelope.seq)
        if row is None:
            return None, None
        taken: str | None = row["taken"]
        return taken, None if row["workflow_id"] is None else position_from(row)

    async def start_run(self, *, workflow_id: str, workflow: str, schema_version: int,
                        input: Any, first_phase: str, message: Envelope,
                        classification: str = "internal", region: str | None = None
                        ) -> CreatedRun | None:
        """Insert the run and its start message in the outbox. None if the id existed."""
        row = await self.pool.fetchrow(
            self._q["start_run"], workflow_id, workflow, schema_version, canonical_json(input),
            first_phase, message.dedup_id, message.group_id, message.to_json(),
            classification, region)
        return None if row is None else created_run(row)

    async def start_keyed_run(self, *, workflow_id: str, workflow: str, schema_version: int,
                              input: Any, first_phase: str, message: Envelope, slot: Slot,
                              classification: str = "internal", region: str | None = None
                              ) -> CreatedRun | None:
        """``start_run`` for a workflow with a concurrency key: the run's slot taken in the
        same statement (``slot.key`` the key computed from ``input``), its start message
        written only if it was admitted (migration 0034). None if the id existed."""
        row = await self.pool.fetchrow(
            self._q["start_keyed_run"], workflow_id, workflow, schema_version,
            canonical_json(input), first_phase, message.dedup_id, message.group_id,
            message.to_json(), classification, region, slot.key, slot.limit, slot.dedup_id,
            slot.group_id, slot.body, slot.rate, slot.window_s)
        return None if row is None else created_run(row)

    async def load_for_phase(self, workflow_id: str, branch: str = MAIN_BRANCH,
                             seq: int | None = None) -> RunPosition | None:
        """``seq``: the message's; a ``waiting`` run is claimed (back to running) only by
        the message of the seq it waits for, never by a late duplicate of an earlier one.
        Shared with concurrent loads under group load (``load_for_phases`` does the same
        per message)."""
        if self.group_load is not None:
            row = await self.group_load.commit((workflow_id, branch, seq))
        else:
            row = await self.pool.fetchrow(self._q["load_for_phase"], workflow_id, branch, seq)
        return None if row is None else position_from(row)

    async def commit_phase(self, commit: PhaseCommit, successor_body: str | None = None, *,
                           lease: Lease | None = None) -> tuple[datetime, int | None] | None:
        """Run the one commit statement (shared with concurrent commits under group commit,
        phasegate/group_commit.py). None when the run was no longer at this seq.

        ``successor_body``: the successor's JSON when the caller already encoded it (the
        worker sends the same string after the commit: one encoding per transition).
        ``lease``: the holder runs the successor itself (local continuation): no outbox row,
        a chain lease on the run's position instead (migration 0020), so no outbox id."""
        successor = commit.successor
        waits = (commit.wait_s, commit.wait_until, commit.wait_signal) != (None, None, None)
        if (lease is not None and successor is not None and commit.status == "running"
                and not waits):
            return await self._continue_phase(commit, successor, lease)
        if successor is not None and successor_body is None:
            successor_body = successor.to_json()
        args = (commit.workflow_id, commit.branch, commit.seq,
                commit.phase, commit.schema_version, commit.state_json, commit.state_hash,
                commit.next_phase, commit.status, commit.tier, commit.tier_label,
                commit.resource_versions_json, commit.worker_id, commit.trace_id,
                successor.dedup_id if successor else None,
                successor.group_id if successor else None, successor_body,
                commit.outcome, commit.rerun_of, commit.error, commit.review_json,
                commit.wait_s, commit.wait_until, commit.wait_signal,
                lease.holder if lease else None, lease.seconds if lease else 0.0, None)
        # A plain advance (the run stays running, its successor goes out now) has a leaner
        # statement of its own for when it commits alone (advance_phase, migration 0027).
        alone = None
        if lease is None and successor is not None and commit.status == "running" and not waits:
            alone = (self._q["advance_phase"], (
                commit.workflow_id, commit.branch, commit.seq, commit.phase,
                commit.schema_version, commit.state_json, commit.state_hash, commit.next_phase,
                commit.tier, commit.tier_label, commit.resource_versions_json,
                commit.worker_id, commit.trace_id, commit.outcome, commit.rerun_of,
                commit.error, commit.review_json, successor.dedup_id, successor.group_id,
                successor_body))
        # A wait (kept signal matched, row due later, run `waiting`) is the single-row
        # statement's alone: commit_phases does not implement it, so those commits never join
        # a group (and commit_phases refuses a row with a wait, which sends its batch to the
        # single-row fallback, should one slip through).
        if self.group_commit is not None and not waits:
            row = await self.group_commit.commit(args, alone)
        elif alone is not None:
            row = await self.pool.fetchrow(alone[0], *alone[1])
        else:
            row = await self.pool.fetchrow(self._q["commit_phase"], *args)
        if row is None or row["committed_at"] is None:
            return None
        return row["committed_at"], row["outbox_id"]

    async def _continue_phase(self, commit: PhaseCommit, successor: Envelope,
                              lease: Lease) -> tuple[datetime, int | None] | None:
        """A continued hop's commit: the phase advanced, the run stays running, and the
        lease's holder runs the successor itself. Alone it is ``continue_phase``, the leaner
        statement (migration 0021); grouped with other commits it is a row of
        ``commit_phases`` like any other. No outbox row either way, so the successor is not
        encoded: its traceparent is all the position keeps of it."""
        lean = (commit.workflow_id, commit.branch, commit.seq, commit.phase,
                commit.schema_version, commit.state_json, commit.state_hash, commit.next_phase,
                commit.tier, commit.tier_label, commit.resource_versions_json,
                commit.worker_id, commit.trace_id, commit.outcome, commit.rerun_of,
                commit.error, commit.review_json, lease.holder, lease.seconds,
                successor.traceparent)
        if self.group_commit is None:
            row = await self.pool.fetchrow(self._q["continue_phase"], *lean)
        else:
            # commit_phases reads a leased row's successor only for its traceparent.
            traceparent = successor.traceparent
            stub = ("{}" if traceparent is None
                    else '{"traceparent": ' + encode_basestring(traceparent) + "}")
            args = (commit.workflow_id, commit.branch, commit.seq, commit.phase,
                    commit.schema_version, commit.state_json, commit.state_hash,
                    commit.next_phase, commit.status, commit.tier, commit.tier_label,
                    commit.resource_versions_json, commit.worker_id, commit.trace_id,
                    successor.dedup_id, successor.group_id, stub, commit.outcome,
                    commit.rerun_of, commit.error, commit.review_json, None, None, None,
                    lease.holder, lease.seconds, None)
            row = await self.group_commit.commit(args, (self._q["continue_phase"], lean))
        if row is None or row["committed_at"] is None:
            return None
        return row["committed_at"], None

    async def record_failure(self, workflow_id: str, seq: int, error: str,
                             max_attempts: int, *, phase: str | None = None,
                             worker_id: str | None = None) -> tuple[int, str] | None:
        """Count a failed attempt (and keep it in ``phase_attempts``); (attempts, status)."""
        row = await self.pool.fetchrow(
            self._q["record_failure"], workflow_id, seq, error, max_attempts, phase, worker_id)
        return (row["attempts"], row["status"]) if row else None

    async def halt_run(self, workflow_id: str, seq: int, status: str, reason: str) -> bool:
        return await self.pool.fetchval(
            self._q["halt_run"], workflow_id, seq, status, reason) is not None

    async def emergency_checkpoint(self, *, workflow_id: str, branch: str, seq: int, phase: str,
                                   schema_version: int, state: Any, worker_id: str) -> bool:
        canonical = canonical_json(state)
        return await self.pool.fetchval(
            self._q["emergency_checkpoint"], workflow_id, branch, seq, phase, schema_version,
            canonical, state_hash(canonical), worker_id) is not None

    # -- outbox

    async def successor(self, workflow_id: str, branch: str, seq: int) -> OutboxRow | None:
        row = await self.pool.fetchrow(self._q["successor"], workflow_id, branch, seq)
        return OutboxRow(**dict(row)) if row else None

    async def mark_sent(self, outbox_ids: Sequence[int]) -> None:
        if outbox_ids:
            await self.pool.execute(self._q["mark_sent"], list(outbox_ids))

    async def claim_unsent(self, after_s: float, limit: int, lease: Lease) -> list[OutboxRow]:
        """Claim due rows for sending (committed: see ``claim_unsent`` in queries.sql)."""
        rows = await self.pool.fetch(self._q["claim_unsent"], after_s, limit, lease.holder,
                                     lease.seconds)
        return [OutboxRow(**dict(row)) for row in rows]

    async def extend_leases(self, outbox_ids: Sequence[int], lease: Lease) -> set[int]:
        """Extend ``lease.holder``'s leases; returns the ids still held."""
        if not outbox_ids:
            return set()
        rows = await self.pool.fetch(self._q["extend_leases"], list(outbox_ids), lease.holder,
                                     lease.seconds)
        return {row["outbox_id"] for row in rows}

    async def extend_chains(self, workflow_ids: Sequence[str], lease: Lease) -> set[str]:
        """Extend the chain leases ``lease.holder`` holds; returns the runs still held."""
        if not workflow_ids:
            return set()
        rows = await self.pool.fetch(self._q["extend_chains"], list(workflow_ids),
                                     lease.holder, lease.seconds)
        return {row["workflow_id"] for row in rows}

    async def end_chain(self, successor: Envelope, body: str, *, holder: str | None,
                        lease: Lease | None = None) -> int | None:
        """Write a chain's message (``successor``, encoded as ``body``) as an outbox row and
        clear the chain lease: as its ``holder``, or with ``holder=None`` as the rescuer of an
        expired one. ``lease``: the row's own lease (a retry's backoff, a relay's claim).
        The row's id, or None when there was no such chain at that seq."""
        outbox_id: int | None = await self.pool.fetchval(
            self._q["end_chain"], successor.workflow_id, successor.seq, holder,
            successor.dedup_id, successor.group_id, body,
            lease.holder if lease else None, lease.seconds if lease else 0.0)
        return outbox_id

    async def chain_of(self, workflow_id: str, next_seq: int) -> ChainLease | None:
        """The chain lease on the run's position at ``next_seq``, if any."""
        row = await self.pool.fetchrow(self._q["chain_of"], workflow_id, next_seq)
        return ChainLease(**dict(row)) if row else None

    async def expired_chains(self, limit: int) -> list[ChainLease]:
        """Chains whose lease ran out (their worker died mid-chain), oldest first."""
        rows = await self.pool.fetch(self._q["expired_chains"], limit)
        return [ChainLease(**dict(row)) for row in rows]

    async def release_leases(self, outbox_ids: Sequence[int], holder: str) -> None:
        if outbox_ids:
            await self.pool.execute(self._q["release_leases"], list(outbox_ids), holder)

    async def outbox_lag_s(self) -> float:
        return float(await self.pool.fetchval(self._q["outbox_lag"]))

    # -- quarantine

    async def quarantine(self, *, message_id: str, workflow_id: str | None, reason: str,
                         body_bytes: int, worker_id: str) -> int:
        return int(await self.pool.fetchval(
            self._q["quarantine"], message_id, workflow_id, reason, body_bytes, worker_id))

    async def count_crash(self, message_id: str, error_type: str) -> int:
        """One more crash of the transition on this SQS message; the count so far."""
        return int(await self.pool.fetchval(self._q["count_crash"], message_id, error_type))

    async def fail_run(self, workflow_id: str, reason: str) -> bool:
        """Fail a run that has not ended, whatever its seq (its message was given up)."""
        return await self.pool.fetchval(self._q["fail_run"], workflow_id, reason) is not None


def decode_state(state_json: str | None) -> Any:
    return None if state_json is None else json.loads(state_json)
