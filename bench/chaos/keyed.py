"""The keyed workload under chaos (``--keyed N``): one run in N is keyed, in bursts of three
runs of one key started together, of one kind for two bursts in turn: ``chaos-keyed`` (two
concurrency keys with a limit of two runs holding a slot) and ``chaos-paced`` (the same keys,
at most one admission per key in any four seconds). Each kind is started half through the
API's start (the slot taken where the run is created) and half as a producer's bare start
message (the slot taken by the worker that receives it).

I10 holds when no sample ever saw more runs of one key holding a slot than the limit, and
some run had to wait its turn (so the queue and its admissions were exercised, not only the
free slots). The slot holders are counted in one statement, a consistent snapshot of the run
rows, several times a second through the whole run, Postgres restarts included (a sample that
fails is skipped and counted).

I12 holds when no window of the rate's length holds more admissions of one paced key than the
rate, read from the admission times Postgres recorded, and some paced run waited (its wake-up
came through the relay's due rows, under the same faults).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from bench.chaos.invariants import DATABASE_ERRORS, Result
from bench.chaos.workload import (
    KEYED_KEYS,
    KEYED_LIMIT,
    KEYED_PREFIX,
    PACED_PREFIX,
    PACED_RATE,
    PACED_WINDOW_S,
    chaos_keyed,
    chaos_paced,
    is_keyed,
    keyed_kind,
)
from phasegate.envelope import start_message
from phasegate.orchestrator.starter import start_workflow
from phasegate.queue import Outgoing, Queue
from phasegate.store import Store

SAMPLE_EVERY_S = 0.2
# One run more than a key's limit, started together: the last always waits (keyed_ordinal).
KEYED_BURST = KEYED_LIMIT + 1

# A slot is held by every run of the key that is neither queued nor ended
# (docs/how-to/concurrency.md).
SLOT_HOLDERS = """
SELECT concurrency_key, count(*) AS n
  FROM workflow_runs
 WHERE workflow = $1 AND concurrency_key IS NOT NULL
   AND status NOT IN ('queued', 'completed', 'failed', 'cancelled')
 GROUP BY concurrency_key
"""

# Admitted in a later transaction than the one that queued it: the run waited for a slot.
WAITED = """
SELECT count(*) FROM run_admissions WHERE workflow = $1 AND admitted_at > queued_at
"""

# Every admission of the paced workflow, in database time (the clock the rate is kept by).
ADMISSIONS = """
SELECT concurrency_key, extract(epoch FROM admitted_at)::float8 AS t
  FROM run_admissions
 WHERE workflow = $1 AND admitted_at IS NOT NULL
"""



@dataclass
class SlotWatch:
    """The most runs of each key seen holding a slot at once, and every sample above the
    limit."""

    limit: int = KEYED_LIMIT
    samples: int = 0
    failed: int = 0
    most: dict[str, int] = field(default_factory=dict)
    over: list[str] = field(default_factory=list)

    async def sample(self, pool: asyncpg.Pool, at_s: float) -> None:
        try:
            rows = await pool.fetch(SLOT_HOLDERS, chaos_keyed.name)
        except DATABASE_ERRORS:
            self.failed += 1  # Postgres is restarting; the next sample looks again
            return
        self.samples += 1
        for row in rows:
            key, n = row["concurrency_key"], row["n"]
            self.most[key] = max(n, self.most.get(key, 0))
            if n > self.limit:
                self.over.append(f"{key}: {n} holders at {at_s:.1f}s")

    async def watch(self, pool: asyncpg.Pool, clock: Any, stop: asyncio.Event) -> None:
        """Samples until ``stop`` is set, ``SAMPLE_EVERY_S`` apart."""
        while not stop.is_set():
            await self.sample(pool, clock())
            # The sampling cadence, not a synchronisation: the stop ends the wait at once.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)


def keyed_ordinal(i: int, every: int) -> int | None:
    """Which keyed run run ``i`` of the workload is (None: not keyed). Keyed runs come in
    bursts of KEYED_BURST consecutive runs, one burst in every ``every``, so a key always has
    one run more than its limit started together: at any production pace (the long schedule
    starts a run every 6 s, longer than a keyed run lives) some run has to wait its turn."""
    if every <= 0 or (i // KEYED_BURST) % every != every - 1:
        return None
    return (i // (KEYED_BURST * every)) * KEYED_BURST + i % KEYED_BURST


def in_burst(ordinal: int | None) -> bool:
    """A keyed run after the first of its burst: started at once, not at the workload's pace."""
    return ordinal is not None and ordinal % KEYED_BURST > 0


def keyed_prefix(ordinal: int) -> str:
    """The workflow id prefix of the ``ordinal``-th keyed run: its kind, by two bursts in
    turn (so each kind has bursts of both keys)."""
    return PACED_PREFIX if (ordinal // KEYED_BURST // 2) % 2 else KEYED_PREFIX


async def start_keyed(store: Store, queue: Queue, i: int, ordinal: int,
                      workflow_id: str) -> None:
    """Run ``i`` of the workload, the ``ordinal``-th keyed one (its kind is in its id,
    ``keyed_prefix``): one key per burst, the keys in turn, and every other one through the
    API's start, the rest as a bare start message (no run row until a worker takes its
    slot), so each key of each kind gets runs of both starts."""
    workflow = keyed_kind(workflow_id)
    burst = ordinal // KEYED_BURST
    input = {"i": i, "tenant": KEYED_KEYS[burst % len(KEYED_KEYS)]}
    if (ordinal + burst) % 2 == 0:
        await start_workflow(store, queue, workflow=workflow, input=input,
                             workflow_id=workflow_id)
        return
    message = start_message(workflow_id, workflow.name, input)
    await queue.send([Outgoing(message.to_json(), message.group_id, message.dedup_id)])


async def keyed_results(dsn: str, watch: SlotWatch, started: list[str]) -> list[Result]:
    """I10 and I12 for the keyed runs of ``started`` (none: nothing to check)."""
    keyed = [w for w in started if is_keyed(w)]
    paced = [w for w in keyed if keyed_kind(w) is chaos_paced]
    if not keyed:
        return []
    connection = await asyncpg.connect(dsn)
    try:
        waited_keyed: int = await connection.fetchval(WAITED, chaos_keyed.name)
        waited_paced: int = await connection.fetchval(WAITED, chaos_paced.name)
        rows = await connection.fetch(ADMISSIONS, chaos_paced.name)
    finally:
        await connection.close()
    admissions: dict[str, list[float]] = {}
    for row in rows:
        admissions.setdefault(row["concurrency_key"], []).append(row["t"])
    results = [i10_keys_within_limit(watch, len(keyed) - len(paced), waited_keyed)]
    if paced:
        results.append(i12_rate_kept(admissions, len(paced), waited_paced))
    return results


def most_in_any_window(times: list[float], window_s: float) -> int:
    """The largest number of times within any half-open window [t, t + window_s)."""
    ordered = sorted(times)
    return max((sum(1 for u in ordered if t <= u < t + window_s) for t in ordered), default=0)


def i10_keys_within_limit(watch: SlotWatch, keyed_runs: int, waited_runs: int) -> Result:
    ok = not watch.over and watch.samples > 0 and waited_runs > 0
    return Result(
        f"I10 a concurrency key never had more than {watch.limit} runs holding a slot",
        ok, f"{keyed_runs} keyed runs, {waited_runs} waited for a slot; most holders seen per "
        f"key {dict(sorted(watch.most.items()))} in {watch.samples} samples "
        f"({watch.failed} failed)"
        + (f"; over the limit: {watch.over[:5]}" if watch.over else "")
        + ("; no run ever waited: the queue was not exercised" if not waited_runs else ""))


def i12_rate_kept(admissions: dict[str, list[float]], paced_runs: int,
                  waited_runs: int) -> Result:
    """No key's admissions in any window of PACED_WINDOW_S above PACED_RATE; some run waited."""
    most = {key: most_in_any_window(times, PACED_WINDOW_S) for key, times in admissions.items()}
    over = {key: n for key, n in most.items() if n > PACED_RATE}
    ok = not over and bool(admissions) and waited_runs > 0
    return Result(
        f"I12 a paced key never had more than {PACED_RATE} admission"
        f"{'' if PACED_RATE == 1 else 's'} in any {PACED_WINDOW_S:g} s",
        ok, f"{paced_runs} paced runs, {sum(map(len, admissions.values()))} admitted, "
        f"{waited_runs} waited; most admissions in one window per key {dict(sorted(most.items()))}"
        + (f"; over the rate: {over}" if over else "")
        + ("; no run ever waited: the rate was not exercised" if not waited_runs else ""))
