"""What the API's start costs its caller, against the least a start needs: one INSERT and one
SQS send.

    python -m bench.api_start [--starts 200] [--rounds 5] [--backend memory|moto]

On a private cluster (bench/common.py), one fresh database, and the in-process FIFO (default:
a send costs next to nothing, so the figures are the Postgres side's) or a moto server over
HTTP (whose ~10 ms send, varying by a fifth between rounds, hides the rest), in interleaved
rounds (which goes first alternates), ``--starts`` sequential starts of new runs each way:

- **floor**: what any start needs, with nothing of phasegate: the floor's named INSERT of one
  row (``bench_floor``, as ``bench/floor.py`` writes it), then the send of the message;
- **request path before**: what ``Control.start`` did until the outbox marks were batched:
  ``start_run`` (the run and its outbox row), the send, ``mark_sent`` in the request, then a
  read of the run it answers with (``get_run``);
- **request path now**: ``Control.start`` as the orchestrator runs it: ``start_run``, which
  returns the run as created, the send, and the outbox row's mark posted to the
  orchestrator's batch of marks (``MicroBatcher.post``, flushed by its own task);
- **keyed workflow now**: the same for a workflow with a concurrency key (its own key per
  run, so every start is admitted): ``start_keyed_run`` takes the slot in the start's
  statement (migration 0034), the work a worker's start did before.

Per start, as the caller waits for it: wall time and client CPU (the batch of marks' task
runs in the same process and is counted: its work is moved, not dropped), Postgres
statements per start (by construction, the batch's ``UPDATE`` calls counted and shared by
the starts of its 50 ms), and each way ÷ the floor, per round, median over rounds. Results:
bench/results/api-start-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg

from bench.common import ROOT, Databases, machine, moto_server, write_results
from bench.transition_processes import _queue_pair
from phasegate.batcher import MARK_SENT_LINGER_S, MARKS_PER_CALL, MicroBatcher
from phasegate.db import create_pool
from phasegate.envelope import canonical_json, start_message
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.embedded import local_aws_env
from phasegate.orchestrator.views import Views
from phasegate.queue import Outgoing, Queue, SqsQueue
from phasegate.store import Store
from phasegate.worker.fake_queue import InMemoryFifoQueue
from phasegate.workflow import Registry, Workflow

FLOOR = "floor: INSERT, then the send"
BEFORE = "request path before: start_run, send, mark_sent, get_run"
NOW = "request path now: start_run (the run returned), send, the mark batched"
KEYED = "keyed workflow now: start_keyed_run (slot taken), send, the mark batched"
WAYS = (FLOOR, BEFORE, NOW, KEYED)
INPUT = {"a": 1, "b": "x" * 50}
FLOOR_INSERT = "INSERT INTO bench_floor (workflow_id, seq, state) VALUES ($1, 0, $2::jsonb)"

workflow = Workflow("bench-api-start", schema_version=1)


@workflow.phase("only")
async def only(ctx: Any, state: Any) -> Any:
    return state


# Its own key per run: every start is admitted, as most are.
keyed = Workflow("bench-api-start-keyed", schema_version=1,
                 concurrency_key=lambda input: str(input["k"]), max_concurrency=1)


@keyed.phase("only")
async def keyed_only(ctx: Any, state: Any) -> Any:
    return state


async def _starts(way: str, dsn: str, queue: Queue, starts: int) -> dict[str, float]:
    pool = await create_pool(dsn, min_size=2, max_size=4)
    floor = await asyncpg.connect(dsn) if way == FLOOR else None
    flushes = 0

    async def mark(outbox_ids: Sequence[int]) -> None:
        nonlocal flushes
        flushes += 1
        await Store(pool).mark_sent(outbox_ids)

    marks = MicroBatcher[int](mark, max_size=MARKS_PER_CALL, max_concurrent=2,
                              linger_s=MARK_SENT_LINGER_S)
    marking = asyncio.ensure_future(marks.run())
    control = Control(pool, queue, Registry([workflow, keyed]), actor="bench",
                      mark_sent=marks.post if way in (NOW, KEYED) else None)
    store, views = Store(pool), Views(pool)
    prefix = uuid.uuid4().hex[:8]

    async def one(i: int) -> None:
        workflow_id = f"api-{prefix}-{i}"
        if floor is not None:
            await floor.execute(FLOOR_INSERT, workflow_id, canonical_json(INPUT))
            message = start_message(workflow_id, workflow.name, None)
            await queue.send([Outgoing(message.to_json(), message.group_id, message.dedup_id)])
        elif way == BEFORE:
            message = start_message(workflow_id, workflow.name, None)
            created = await store.start_run(
                workflow_id=workflow_id, workflow=workflow.name, schema_version=1, input=INPUT,
                first_phase=workflow.first_phase, message=message)
            # An unkeyed start always writes its message (None is a keyed run's, queued).
            assert created is not None and created.outbox_id is not None
            await queue.send([Outgoing(message.to_json(), message.group_id, message.dedup_id)])
            await store.mark_sent([created.outbox_id])
            await views.get_run(workflow_id)
        elif way == KEYED:
            run, _ = await control.start(keyed.name, {**INPUT, "k": workflow_id}, workflow_id)
            assert run.status == "pending", run
        else:
            await control.start(workflow.name, INPUT, workflow_id)

    try:
        await one(-1)  # first use: statement descriptions, the SQS client's connection
        await asyncio.sleep(MARK_SENT_LINGER_S * 2)  # its mark goes before the timing
        flushes = 0
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(starts):
            await one(i)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        marking.cancel()
        await asyncio.gather(marking, return_exceptions=True)  # flushes what is queued
        # By construction: the floor's INSERT; start_run, mark_sent and get_run; start_run
        # and the batch's UPDATEs (counted), shared by the starts of one batch.
        statements = {FLOOR: 1.0, BEFORE: 3.0}.get(way, 1 + flushes / starts)
        unmarked = await pool.fetchval(
            "SELECT count(*) FROM outbox WHERE workflow_id LIKE $1 AND sent_at IS NULL",
            f"api-{prefix}-%")
        assert unmarked == 0, (way, unmarked)
    finally:
        marking.cancel()
        if floor is not None:
            await floor.close()
        await pool.close()
    return {"wall_us": wall / starts * 1e6, "client_cpu_us": cpu / starts * 1e6,
            "statements": statements}


@contextlib.asynccontextmanager
async def _queue(endpoint: str | None) -> AsyncIterator[Queue]:
    """The in-process FIFO (``endpoint`` None), or a new queue on the moto server."""
    if endpoint is None:
        yield InMemoryFifoQueue()
        return
    urls = await _queue_pair(endpoint, "bench-api-start")
    async with SqsQueue(urls[0], endpoint_url=endpoint, region="us-east-1") as queue:
        yield queue


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    databases = await Databases(private=True).start()
    found: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    try:
        dsn = await databases.fresh()
        with contextlib.ExitStack() as stack:
            endpoint = stack.enter_context(moto_server()) if args.backend == "moto" else None
            for r in range(args.rounds):
                for way in (WAYS if r % 2 == 0 else tuple(reversed(WAYS))):
                    # A fresh queue each time (moto's send slows as a queue fills).
                    async with _queue(endpoint) as queue:
                        found[way].append(await _starts(way, dsn, queue, args.starts))
                    print(f"round {r + 1}/{args.rounds}: {way}: "
                          f"{found[way][-1]['wall_us']:.0f} µs", file=sys.stderr)
    finally:
        await databases.stop()
    ratios = {way: {key: statistics.median(w[key] / f[key] for w, f in
                                           zip(found[way], found[FLOOR], strict=True))
                    for key in ("wall_us", "client_cpu_us")} for way in (BEFORE, NOW, KEYED)}
    return {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
            "command": "python -m bench.api_start " + " ".join(sys.argv[1:]),
            "rounds": found,
            "medians": {way: {k: statistics.median(r[k] for r in v) for k in v[0]}
                        for way, v in found.items()},
            "over_floor": ratios,
            "now_over_before": {key: statistics.median(
                n[key] / b[key] for n, b in zip(found[NOW], found[BEFORE], strict=True))
                for key in ("wall_us", "client_cpu_us", "statements")}}


def markdown(report: dict[str, Any]) -> str:
    lines = ["| a start, as its caller waits for it (median of rounds) | wall (µs) | "
             "client CPU (µs) | Postgres statements |", "|---|---:|---:|---:|"]
    lines += [f"| {way} | {v['wall_us']:.0f} | {v['client_cpu_us']:.0f} | "
              f"{v['statements']:.2f} |" for way, v in report["medians"].items()]
    lines += ["", "| ÷ the floor, median of per-round ratios | wall | client CPU |",
              "|---|---:|---:|"]
    lines += [f"| {way} | {v['wall_us']:.2f} | {v['client_cpu_us']:.2f} |"
              for way, v in report["over_floor"].items()]
    now = report["now_over_before"]
    lines += ["", f"now ÷ before: wall {now['wall_us']:.3f}, client CPU "
              f"{now['client_cpu_us']:.3f}, statements {now['statements']:.3f}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=["memory", "moto"], default="memory")
    args = parser.parse_args()
    report = asyncio.run(bench(args))
    path = write_results("api-start", report)
    print(markdown(report))
    print(f"\nresults: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
