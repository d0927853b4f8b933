"""Data residency: which PostgreSQL store holds a run, fixed when the run starts.

``PHASEGATE_STORES`` maps region names to DSNs (``{"default": dsn, "eu": dsn, ...}``). A run
has a classification (public, internal, sensitive, regulated; default internal) and, for
sensitive and regulated runs, a region. The run lives in its region's store (no region: the
default store) from its start to its purge; nothing about it is ever written elsewhere.

Enforced here, in the store layer, not by callers:

- ``RegionalStore`` is a ``Store`` that knows its region. A start for a run of another region
  is refused (``ResidencyError``), and so is every write for a run this store does not hold or
  that belongs to another region -- checked against the run's residency as loaded from this
  store's own database (remembered per run; one lookup on a miss). Every checkpoint it commits
  emits an audit event (``phasegate/audit.py``).
- ``StoreRouter`` is the worker's store when several are configured: each call goes to the
  store of the message being handled (``route()``, a context variable set by the transition)
  or of the run named in the call. A region with no store is refused before anything is
  written anywhere.

A single-store deployment (only ``PHASEGATE_DATABASE_URL``) uses one ``RegionalStore`` for
the default region: the same statements as before, no extra round trip.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, contextmanager, nullcontext
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any

import asyncpg

from phasegate import audit
from phasegate.db import pool_from_settings
from phasegate.envelope import MAIN_BRANCH, Envelope
from phasegate.records import record
from phasegate.sql import migration_files, queries
from phasegate.store import (
    ChainLease,
    CreatedRun,
    Lease,
    OutboxRow,
    PhaseCommit,
    RunPosition,
    Slot,
    Store,
    StoreError,
)

if TYPE_CHECKING:
    from phasegate.settings import Settings

CLASSIFICATIONS = ("public", "internal", "sensitive", "regulated")
REGIONAL = frozenset({"sensitive", "regulated"})
DEFAULT_CLASSIFICATION = "internal"
DEFAULT_REGION = "default"
REGION_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
REMEMBERED_RUNS = 10_000


class ResidencyError(StoreError):
    """A write or start that would put a run's data in a store other than its own."""


@record
class Residency:
    classification: str = DEFAULT_CLASSIFICATION
    region: str | None = None  # None: the default store

    @property
    def store_region(self) -> str:
        return self.region or DEFAULT_REGION


def residency(classification: str | None = None, region: str | None = None) -> Residency:
    """A valid residency or a ``ResidencyError`` saying what is wrong."""
    classification = classification or DEFAULT_CLASSIFICATION
    if classification not in CLASSIFICATIONS:
        raise ResidencyError(f"classification must be one of {list(CLASSIFICATIONS)}, "
                             f"not {classification!r}")
    if region == DEFAULT_REGION:
        region = None
    if region is not None and not REGION_PATTERN.fullmatch(region):
        raise ResidencyError("region must be 1-32 chars of [a-z0-9-], starting with a letter")
    if classification in REGIONAL and region is None:
        raise ResidencyError(f"a {classification} run needs a region (a store named in "
                             "PHASEGATE_STORES other than the default)")
    return Residency(classification, region)


def parse_stores(text: str) -> dict[str, str]:
    """``PHASEGATE_STORES`` -> {region: dsn}. Raises ValueError without echoing a DSN."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError('must be a JSON object like {"default": "postgresql://...", '
                         '"eu": "postgresql://..."}') from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError("must be a non-empty JSON object of region -> PostgreSQL DSN")
    for region, dsn in raw.items():
        if region != DEFAULT_REGION and not REGION_PATTERN.fullmatch(region):
            raise ValueError(f"region {region!r} must be 1-32 chars of [a-z0-9-] starting "
                             "with a letter")
        if not isinstance(dsn, str) or not dsn.startswith(("postgres://", "postgresql://")):
            raise ValueError(f"the store of region {region!r} must be a postgresql:// URL")
    return {str(k): str(v) for k, v in raw.items()}


class RegionalStore(Store):
    """A ``Store`` for one region that refuses writes for runs of any other region.

    ``strict``: a write for a run this process has not loaded or started is checked with one
    lookup (the default when several stores are configured). Without it, only what was
    loaded is checked -- the single-store case, where there is no other store to confuse.
    """

    def __init__(self, pool: asyncpg.Pool, region: str = DEFAULT_REGION, *,
                 strict: bool = False, commit_window_s: float = 0.0,
                 load_window_s: float = 0.0) -> None:
        super().__init__(pool, commit_window_s=commit_window_s, load_window_s=load_window_s)
        self.region = region
        self.strict = strict
        self._gq = queries("governance.sql")
        self._known: OrderedDict[str, Residency] = OrderedDict()
        self._audit_log = audit.bound_logger()

    # -- the checks

    def accepts(self, wanted: Residency) -> None:
        if wanted.store_region != self.region:
            raise ResidencyError(
                f"refused: a {wanted.classification} run of region {wanted.store_region!r} "
                f"cannot be written to the store of region {self.region!r}")

    def _remember(self, workflow_id: str, found: Residency) -> None:
        self._known[workflow_id] = found
        self._known.move_to_end(workflow_id)
        while len(self._known) > REMEMBERED_RUNS:
            self._known.popitem(last=False)

    async def residency_of(self, workflow_id: str) -> Residency | None:
        """The residency of a run this store holds (None: it holds no such run)."""
        row = await self.pool.fetchrow(self._gq["run_residency"], workflow_id)
        if row is None:
            return None
        found = Residency(row["classification"], row["region"])
        self._remember(workflow_id, found)
        return found

    async def guard(self, workflow_id: str) -> Residency:
        """The run's residency, if this store may write for it; else ``ResidencyError``."""
        found = self._known.get(workflow_id)
        if found is None:
            if not self.strict:
                return Residency(classification="unknown")
            found = await self.residency_of(workflow_id)
            if found is None:
                raise ResidencyError(
                    f"refused: the store of region {self.region!r} holds no run "
                    f"{workflow_id}; a run's writes go only to the store fixed at its start")
        if found.store_region != self.region:
            raise ResidencyError(
                f"refused: run {workflow_id} belongs to region {found.store_region!r}, not "
                f"to the store of region {self.region!r}")
        return found

    # -- starts

    async def start_and_load(self, envelope: Envelope, schema_version: int, first_phase: str,
                             classification: str = "internal", region: str | None = None
                             ) -> RunPosition | None:
        # The residency comes from the envelope and is checked against this store's region.
        wanted = residency(envelope.classification, envelope.region)
        self.accepts(wanted)
        position = await super().start_and_load(envelope, schema_version, first_phase,
                                                wanted.classification, wanted.region)
        if position is not None:
            self._remember(envelope.workflow_id,
                           Residency(position.classification, position.region))
        return position

    async def start_keyed(self, envelope: Envelope, schema_version: int, first_phase: str,
                          slot: Slot, classification: str = "internal",
                          region: str | None = None) -> tuple[str | None, RunPosition | None]:
        wanted = residency(envelope.classification, envelope.region)
        self.accepts(wanted)
        taken, position = await super().start_keyed(envelope, schema_version, first_phase,
                                                     slot, wanted.classification,
                                                     wanted.region)
        if position is not None:
            self._remember(envelope.workflow_id,
                           Residency(position.classification, position.region))
        return taken, position

    async def start_run(self, *, workflow_id: str, workflow: str, schema_version: int,
                        input: Any, first_phase: str, message: Envelope,
                        classification: str = "internal", region: str | None = None
                        ) -> CreatedRun | None:
        wanted = residency(message.classification, message.region)
        self.accepts(wanted)
        return await super().start_run(
            workflow_id=workflow_id, workflow=workflow, schema_version=schema_version,
            input=input, first_phase=first_phase, message=message,
            classification=wanted.classification, region=wanted.region)

    async def start_keyed_run(self, *, workflow_id: str, workflow: str, schema_version: int,
                              input: Any, first_phase: str, message: Envelope, slot: Slot,
                              classification: str = "internal", region: str | None = None
                              ) -> CreatedRun | None:
        wanted = residency(message.classification, message.region)
        self.accepts(wanted)
        return await super().start_keyed_run(
            workflow_id=workflow_id, workflow=workflow, schema_version=schema_version,
            input=input, first_phase=first_phase, message=message, slot=slot,
            classification=wanted.classification, region=wanted.region)

    # -- the worker's reads and writes

    async def load_for_phase(self, workflow_id: str, branch: str = MAIN_BRANCH,
                             seq: int | None = None) -> RunPosition | None:
        position = await super().load_for_phase(workflow_id, branch, seq)
        if position is not None:
            self._remember(workflow_id, Residency(position.classification, position.region))
        return position

    async def commit_phase(self, commit: PhaseCommit, successor_body: str | None = None, *,
                           lease: Lease | None = None
                           ) -> tuple[datetime, int | None] | None:
        found = await self.guard(commit.workflow_id)
        result = await super().commit_phase(commit, successor_body, lease=lease)
        if result is not None:
            audit.checkpoint_written(
                workflow_id=commit.workflow_id, seq=commit.seq, branch=commit.branch,
                region=self.region, classification=found.classification,
                logger=self._audit_log)
        return result

    async def record_failure(self, workflow_id: str, seq: int, error: str,
                             max_attempts: int, *, phase: str | None = None,
                             worker_id: str | None = None) -> tuple[int, str] | None:
        await self.guard(workflow_id)
        return await super().record_failure(workflow_id, seq, error, max_attempts,
                                            phase=phase, worker_id=worker_id)

    async def halt_run(self, workflow_id: str, seq: int, status: str, reason: str) -> bool:
        await self.guard(workflow_id)
        return await super().halt_run(workflow_id, seq, status, reason)

    async def emergency_checkpoint(self, *, workflow_id: str, branch: str, seq: int, phase: str,
                                   schema_version: int, state: Any, worker_id: str) -> bool:
        found = await self.guard(workflow_id)
        done = await super().emergency_checkpoint(
            workflow_id=workflow_id, branch=branch, seq=seq, phase=phase,
            schema_version=schema_version, state=state, worker_id=worker_id)
        if done:
            audit.checkpoint_written(workflow_id=workflow_id, seq=seq, branch=branch,
                                     region=self.region, classification=found.classification,
                                     kind="emergency", logger=self._audit_log)
        return done


_ROUTE: ContextVar[RegionalStore | None] = ContextVar("phasegate_store_route", default=None)


class StoreRouter(Store):
    """The ``Store`` of a worker with several regional stores: every call goes to one of them.

    Calls that name a run go to the store that run was routed to; the rest (and ``pool``,
    which the step ledger and the door use) to the store of the message being handled.
    """

    def __init__(self, stores: Mapping[str, RegionalStore]) -> None:
        if DEFAULT_REGION not in stores:
            raise ValueError("a StoreRouter needs a default store")
        self.stores = dict(stores)
        self._q = queries()
        self._runs: OrderedDict[str, str] = OrderedDict()

    @property  # the current route's pool; never assigned
    def pool(self) -> asyncpg.Pool:
        return self.current().pool

    @property
    def regions(self) -> list[str]:
        return sorted(self.stores)

    def current(self) -> RegionalStore:
        return _ROUTE.get() or self.stores[DEFAULT_REGION]

    def for_region(self, region: str | None) -> RegionalStore:
        store = self.stores.get(region or DEFAULT_REGION)
        if store is None:
            raise ResidencyError(f"refused: no store is configured for region {region!r} "
                                 f"(PHASEGATE_STORES has {self.regions})")
        return store

    def for_run(self, workflow_id: str) -> RegionalStore:
        region = self._runs.get(workflow_id)
        return self.stores[region] if region is not None else self.current()

    @contextmanager
    def routed(self, envelope: Envelope) -> Iterator[RegionalStore]:
        store = self.for_region(envelope.region)
        self._runs[envelope.workflow_id] = store.region
        self._runs.move_to_end(envelope.workflow_id)
        while len(self._runs) > REMEMBERED_RUNS:
            self._runs.popitem(last=False)
        token = _ROUTE.set(store)
        try:
            yield store
        finally:
            _ROUTE.reset(token)

    async def locate(self, workflow_id: str) -> RegionalStore | None:
        """The store that holds a run (the control plane asks every store)."""
        for region in self.regions:
            store = self.stores[region]
            if await store.residency_of(workflow_id) is not None:
                return store
        return None

    # -- the Store interface, routed

    async def ping(self) -> None:
        for store in self.stores.values():
            await store.ping()

    async def start_and_load(self, envelope: Envelope, schema_version: int, first_phase: str,
                             classification: str = "internal", region: str | None = None
                             ) -> RunPosition | None:
        return await self.for_region(envelope.region).start_and_load(
            envelope, schema_version, first_phase)

    async def start_keyed(self, envelope: Envelope, schema_version: int, first_phase: str,
                          slot: Slot, classification: str = "internal",
                          region: str | None = None) -> tuple[str | None, RunPosition | None]:
        return await self.for_region(envelope.region).start_keyed(
            envelope, schema_version, first_phase, slot)

    async def start_run(self, *, workflow_id: str, workflow: str, schema_version: int,
                        input: Any, first_phase: str, message: Envelope,
                        classification: str = "internal", region: str | None = None
                        ) -> CreatedRun | None:
        return await self.for_region(message.region).start_run(
            workflow_id=workflow_id, workflow=workflow, schema_version=schema_version,
            input=input, first_phase=first_phase, message=message)

    async def start_keyed_run(self, *, workflow_id: str, workflow: str, schema_version: int,
                              input: Any, first_phase: str, message: Envelope, slot: Slot,
                              classification: str = "internal", region: str | None = None
                              ) -> CreatedRun | None:
        return await self.for_region(message.region).start_keyed_run(
            workflow_id=workflow_id, workflow=workflow, schema_version=schema_version,
            input=input, first_phase=first_phase, message=message, slot=slot)

    async def load_for_phase(self, workflow_id: str, branch: str = MAIN_BRANCH,
                             seq: int | None = None) -> RunPosition | None:
        return await self.for_run(workflow_id).load_for_phase(workflow_id, branch, seq)

    async def commit_phase(self, commit: PhaseCommit, successor_body: str | None = None, *,
                           lease: Lease | None = None
                           ) -> tuple[datetime, int | None] | None:
        return await self.for_run(commit.workflow_id).commit_phase(
            commit, successor_body, lease=lease)

    async def record_failure(self, workflow_id: str, seq: int, error: str,
                             max_attempts: int, *, phase: str | None = None,
                             worker_id: str | None = None) -> tuple[int, str] | None:
        return await self.for_run(workflow_id).record_failure(
            workflow_id, seq, error, max_attempts, phase=phase, worker_id=worker_id)

    async def halt_run(self, workflow_id: str, seq: int, status: str, reason: str) -> bool:
        return await self.for_run(workflow_id).halt_run(workflow_id, seq, status, reason)

    async def emergency_checkpoint(self, *, workflow_id: str, branch: str, seq: int, phase: str,
                                   schema_version: int, state: Any, worker_id: str) -> bool:
        return await self.for_run(workflow_id).emergency_checkpoint(
            workflow_id=workflow_id, branch=branch, seq=seq, phase=phase,
            schema_version=schema_version, state=state, worker_id=worker_id)

    async def successor(self, workflow_id: str, branch: str, seq: int) -> OutboxRow | None:
        return await self.for_run(workflow_id).successor(workflow_id, branch, seq)

    async def chain_of(self, workflow_id: str, next_seq: int) -> ChainLease | None:
        return await self.for_run(workflow_id).chain_of(workflow_id, next_seq)

    async def end_chain(self, successor: Envelope, body: str, *, holder: str | None,
                        lease: Lease | None = None) -> int | None:
        return await self.for_run(successor.workflow_id).end_chain(
            successor, body, holder=holder, lease=lease)

    async def mark_sent(self, outbox_ids: Sequence[int]) -> None:
        # Outbox ids are per database: only ever called inside the route of their message.
        await self.current().mark_sent(outbox_ids)

    async def outbox_lag_s(self) -> float:
        return max([await s.outbox_lag_s() for s in self.stores.values()])

    async def quarantine(self, *, message_id: str, workflow_id: str | None, reason: str,
                         body_bytes: int, worker_id: str) -> int:
        return await self.current().quarantine(
            message_id=message_id, workflow_id=workflow_id, reason=reason,
            body_bytes=body_bytes, worker_id=worker_id)


def route(store: Store, envelope: Envelope) -> AbstractContextManager[object]:
    """Handle ``envelope`` against its run's store (a no-op with a single store)."""
    if isinstance(store, StoreRouter):
        return store.routed(envelope)
    return _SINGLE_STORE


# Entered on every message: one object, no generator, when there is one store.
_SINGLE_STORE = nullcontext()


def unroutable(store: Store, envelope: Envelope) -> str | None:
    """Why no configured store may hold this message's run (None: one may). No payload data."""
    try:
        wanted = residency(envelope.classification, envelope.region)
    except ResidencyError as exc:
        return str(exc)
    regions = (store.regions if isinstance(store, StoreRouter)
               else [store.region] if isinstance(store, RegionalStore) else [DEFAULT_REGION])
    if wanted.store_region not in regions:
        return f"no store is configured for region {wanted.store_region!r} (stores: {regions})"
    return None


# -- building stores from settings -------------------------------------------------------------

async def check_schema(pool: asyncpg.Pool, region: str) -> None:
    newest = migration_files()[-1][0]
    from phasegate.migrate import schema_version

    current = await schema_version(pool)
    if current < newest:
        raise StoreError(f"the store of region {region!r} is at schema version {current}, this "
                         f"worker needs {newest}: run `phasegate migrate` first")


async def stores_from_settings(settings: Settings, default_pool: asyncpg.Pool,
                               stack: AsyncExitStack, *, pool_max: int | None = None) -> Store:
    """The worker's store: one ``RegionalStore`` or, with PHASEGATE_STORES, a router whose
    regional pools close with ``stack``."""
    store_map = settings.store_map
    commit_s = settings.commit_batch_window_ms / 1000
    load_s = settings.load_batch_window_ms / 1000
    if len(store_map) <= 1:
        return RegionalStore(default_pool, commit_window_s=commit_s, load_window_s=load_s)
    stores = {DEFAULT_REGION: RegionalStore(default_pool, strict=True, commit_window_s=commit_s,
                                            load_window_s=load_s)}
    for region, dsn in sorted(store_map.items()):
        if region == DEFAULT_REGION:
            continue
        pool = await pool_from_settings(settings, dsn=dsn, min_size=min(settings.db_pool_min, 1),
                                        max_size=pool_max or settings.db_pool_max)
        stack.push_async_callback(pool.close)
        await check_schema(pool, region)
        stores[region] = RegionalStore(pool, region, strict=True, commit_window_s=commit_s,
                                       load_window_s=load_s)
    return StoreRouter(stores)


def carry(envelope: Envelope, successor: Envelope | None) -> Envelope | None:
    """A successor message keeps its run's region hint, so any worker routes it to the same
    store (the hint is a store name, never data)."""
    if successor is None or envelope.region is None or successor.region == envelope.region:
        return successor
    return successor.model_copy(update={"region": envelope.region})
