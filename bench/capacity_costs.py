"""What a transition costs a saturated fleet, measured in the capacity plan's shape.

    python -m bench.capacity_costs [--pods 4] [--scale 0.1] [--window-s 40] [--rounds 3]
                                   [--continuation on|off] [--backlog 2]
                                   [--route pgbouncer|current]

The capacity model (bench/capacity.py) multiplies a fleet's transitions per second by what one
transition costs Postgres, the pooler and SQS. This measures those costs the way the plan runs:
``--pods`` workers (``Worker``, each with its own pool of ``PHASEGATE_DB_POOL_MAX`` connections
through PgBouncer in transaction mode, the store and group commit it builds from its settings)
with every slot busy on phases that take a while, and as many runs again waiting in the queue
(``--backlog``: runs per slot).
The plan's times (phases of 5 s, heartbeat 10 s, presence every 15 s, chains of at most 30 s)
are multiplied by ``--scale`` so a run takes a minute instead of ten; every per-pod periodic
write then comes as often per transition as in the plan. The workers share one in-process FIFO
queue (``InMemoryFifoQueue``), counted by API action: what a worker calls does not depend on
which SQS server answers.

Over a window after a warm-up (the chains started, the caches warm), per transition:

- ``server_s``: seconds a server connection spent in a transaction (PgBouncer's
  ``total_xact_time``, admin console ``SHOW STATS``), the capacity model's
  server-connection time (Little's law: connections busy = transitions/s x this);
- ``commits`` and ``wal_bytes``: commit records and WAL bytes written (``pg_walinspect``, on a
  private cluster whose WAL moves only with the run's writes);
- ``sqs``: calls per API action (``ReceiveMessage``, ``SendMessage``, ``DeleteMessage``,
  ``ChangeMessageVisibility``), batches counted once, as SQS counts them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from bench.common import Databases, machine, write_results
from bench.pgbouncer import PgBouncer, current_root
from bench.poolers import wal_commits_since, wal_position
from bench.workload import PAYLOAD
from phasegate import Context, Registry, Workflow
from phasegate.db import create_pool
from phasegate.envelope import start_message
from phasegate.orchestrator.embedded import local_aws_env
from phasegate.queue import Outgoing, Received
from phasegate.residency import RegionalStore
from phasegate.settings import Settings
from phasegate.worker.fake_queue import InMemoryFifoQueue
from phasegate.worker.runtime import Worker

# The plan's times (bench/capacity.py Settings and the chart's defaults), before --scale.
PLAN_PHASE_S = 5.0
PLAN_HEARTBEAT_S = 10.0
PLAN_PRESENCE_S = 15.0
PLAN_CHAIN_S = 30.0
PLAN_CONCURRENCY = 4
PLAN_POOL_MAX = 4
# Long enough that no run ends inside a window: every transition is a mid-run one.
PHASES = 2000


@dataclass
class CountingQueue(InMemoryFifoQueue):
    """The in-process FIFO, with its API calls counted by action."""

    by_action: Counter[str] = field(default_factory=Counter)

    async def send(self, messages: Sequence[Outgoing]) -> None:
        self.by_action["SendMessage"] += 1
        await super().send(messages)

    async def receive(self, max_messages: int, wait_time_s: int,
                      visibility_timeout_s: int) -> list[Received]:
        self.by_action["ReceiveMessage"] += 1
        return await super().receive(max_messages, wait_time_s, visibility_timeout_s)

    async def delete(self, receipt_handles: Sequence[str]) -> None:
        self.by_action["DeleteMessage"] += 1
        await super().delete(receipt_handles)

    async def change_visibility(self, entries: Sequence[tuple[str, int]]) -> None:
        self.by_action["ChangeMessageVisibility"] += 1
        await super().change_visibility(entries)


def sleeping_workflow(phase_s: float) -> Workflow:
    """``capacity-sleep``: PHASES phases that each wait ``phase_s`` and return their state."""
    workflow = Workflow("capacity-sleep")

    async def sleep(ctx: Context, state: Any) -> Any:
        await asyncio.sleep(phase_s)
        return state

    for index in range(PHASES):
        workflow.phase(f"s{index}")(sleep)
    return workflow


def pgbouncer_stats(bouncer: PgBouncer, database: str) -> dict[str, int]:
    """The ``SHOW STATS`` row of ``database`` (totals: live, not the averages' period)."""
    done = subprocess.run(
        ["psql", "-X", "-A", "-F", "|", "-P", "footer=off", "-h", "127.0.0.1", "-p",
         str(bouncer.port), "-U", "postgres", "-d", "pgbouncer", "-c", "SHOW STATS"],
        capture_output=True, text=True, check=True)
    header, *rows = done.stdout.splitlines()
    names = header.split("|")
    for row in rows:
        values = dict(zip(names, row.split("|"), strict=True))
        if values["database"] == database:
            return {k: int(v) for k, v in values.items() if k.startswith("total_")}
    raise RuntimeError(f"PgBouncer's SHOW STATS has no row for {database}: nothing routed?")


def worker_settings(dsn: str, index: int, *, scale: float, continuation: bool) -> Settings:
    heartbeat = PLAN_HEARTBEAT_S * scale
    return Settings(
        database_url=dsn, worker_id=f"capacity-{index}", concurrency=PLAN_CONCURRENCY,
        db_pool_max=PLAN_POOL_MAX, database_pooler="transaction", heartbeat_s=heartbeat,
        visibility_timeout_s=max(2, round(3 * heartbeat)), wait_time_s=max(1, round(2 * heartbeat)),
        presence_interval_s=PLAN_PRESENCE_S * scale,
        presence_retention_s=max(3600.0, 2 * PLAN_PRESENCE_S * scale),
        continuation=continuation, continuation_max_s=PLAN_CHAIN_S * scale,
        metrics_port=0, metrics_host="127.0.0.1")


async def seed(dsn: str, queue: InMemoryFifoQueue, workflow: Workflow, runs: int) -> None:
    pool = await create_pool(dsn, min_size=1, max_size=1, pooler="none")
    store = RegionalStore(pool)
    try:
        for index in range(runs):
            message = start_message(f"capacity-{index}", workflow.name, PAYLOAD)
            await store.start_run(workflow_id=message.workflow_id, workflow=workflow.name,
                                  schema_version=workflow.schema_version, input=PAYLOAD,
                                  first_phase=workflow.first_phase, message=message)
            await queue.send([Outgoing(message.to_json(), message.group_id, message.dedup_id)])
    finally:
        await pool.close()


async def snapshot(admin: Any, bouncer: PgBouncer, database: str,
                   queue: CountingQueue) -> dict[str, Any]:
    return {"at": time.monotonic(), "wal": await wal_position(admin),
            "checkpoints": int(await admin.fetchval("SELECT count(*) FROM checkpoints")),
            "pgbouncer": pgbouncer_stats(bouncer, database), "sqs": dict(queue.by_action)}


async def one_run(databases: Databases, bouncer: PgBouncer, *, pods: int, scale: float,
                  window_s: float, continuation: bool, backlog: int) -> dict[str, Any]:
    direct = await databases.fresh()
    database = direct.rsplit("/", 1)[1]
    routed = bouncer.route(direct)
    workflow = sleeping_workflow(PLAN_PHASE_S * scale)
    queue, dlq = CountingQueue(), CountingQueue()
    admin = await create_pool(direct, min_size=1, max_size=1, pooler="none")
    workers = [Worker(settings=worker_settings(routed, i, scale=scale, continuation=continuation),
                      registry=Registry([workflow]), queue=queue, dlq=dlq)
               for i in range(pods)]
    tasks: list[asyncio.Task[None]] = []
    try:
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        # More runs than slots: a backlog, as when the queue's depth scales the fleet. A
        # freed slot then takes the oldest waiting message, nearly always another run's than
        # the one it just sent, and loads that run as a fleet's worker does.
        await seed(direct, queue, workflow, backlog * pods * PLAN_CONCURRENCY)
        tasks = [asyncio.create_task(w.run()) for w in workers]
        # Two chains' time: every slot busy, chains handed off at their bound at least once.
        await asyncio.sleep(2 * PLAN_CHAIN_S * scale)
        before = await snapshot(admin, bouncer, database, queue)
        await asyncio.sleep(window_s)
        after = await snapshot(admin, bouncer, database, queue)
        server = await wal_commits_since(admin, before["wal"])
        for task in tasks:
            if task.done():  # a worker that stopped early would make the figures a lie
                task.result()
                raise RuntimeError("a worker stopped inside the window")
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await admin.close()
        await databases.drop(direct)
    n = after["checkpoints"] - before["checkpoints"]
    seconds = after["at"] - before["at"]
    xact_us = after["pgbouncer"]["total_xact_time"] - before["pgbouncer"]["total_xact_time"]
    sqs = {k: (after["sqs"].get(k, 0) - before["sqs"].get(k, 0)) / n
           for k in ("ReceiveMessage", "SendMessage", "DeleteMessage", "ChangeMessageVisibility")}
    return {"transitions": n, "window_s": round(seconds, 1),
            "transitions_per_s": round(n / seconds, 2),
            "expected_per_s": round(pods * PLAN_CONCURRENCY / (PLAN_PHASE_S * scale), 2),
            "server_s": round(xact_us / 1e6 / n, 5),
            "server_transactions": round((after["pgbouncer"]["total_xact_count"]
                                          - before["pgbouncer"]["total_xact_count"]) / n, 3),
            "commits": round(server["commits"] / n, 3), "wal_bytes": round(server["wal"] / n),
            "sqs": {k: round(v, 3) for k, v in sqs.items()}}


def largest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each per-transition figure's largest value over the rounds: what the model takes."""
    figures = ("server_s", "server_transactions", "commits", "wal_bytes")
    out: dict[str, Any] = {k: max(r[k] for r in runs) for k in figures}
    out["sqs"] = {k: max(r["sqs"][k] for r in runs) for k in runs[0]["sqs"]}
    return out


async def bench(*, pods: int, scale: float, window_s: float, continuation: bool,
                route: str, rounds: int, backlog: int) -> dict[str, Any]:
    databases = await Databases(private=True).start()
    bouncer = PgBouncer.in_front_of(databases.server_dsn,
                                    root=current_root() if route == "current" else None,
                                    server_pool=PLAN_POOL_MAX * pods,
                                    extra={"stats_users": "postgres"}).start()
    try:
        runs = []
        for round_ in range(rounds):
            result = await one_run(databases, bouncer, pods=pods, scale=scale,
                                   window_s=window_s, continuation=continuation,
                                   backlog=backlog)
            print(f"round {round_ + 1}: {json.dumps(result)}", flush=True)
            runs.append(result)
        return {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine(),
                "pgbouncer": bouncer.version(), "pods": pods,
                "scale": scale, "window_s": window_s, "continuation": continuation,
                "backlog": backlog,
                "plan": {"phase_s": PLAN_PHASE_S, "heartbeat_s": PLAN_HEARTBEAT_S,
                         "presence_s": PLAN_PRESENCE_S, "chain_s": PLAN_CHAIN_S,
                         "concurrency": PLAN_CONCURRENCY, "pool_max": PLAN_POOL_MAX},
                "runs": runs, "largest": largest(runs)}
    finally:
        bouncer.stop()
        await databases.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity_costs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--scale", type=float, default=0.1,
                        help="the plan's times multiplied by this (phases of 5 s x scale)")
    parser.add_argument("--window-s", type=float, default=40.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--continuation", choices=("on", "off"), default="on")
    parser.add_argument("--backlog", type=int, default=2,
                        help="runs per slot (1: no backlog, every run always in a slot)")
    parser.add_argument("--route", choices=("pgbouncer", "current"), default="pgbouncer",
                        help="PgBouncer 1.18 (Debian 12) or a current one (1.24)")
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    report = asyncio.run(bench(pods=args.pods, scale=args.scale, window_s=args.window_s,
                               continuation=args.continuation == "on", route=args.route,
                               rounds=args.rounds, backlog=args.backlog))
    print(f"largest: {json.dumps(report['largest'])}")
    path = write_results("capacity-costs", report, args.label)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
