"""A fleet soak: worker processes and the orchestrator through PgBouncer, then the chaos
suite's invariants; the same run direct, and throughput pooled ÷ direct.

    python -m bench.soak --runs 10000 --workers 8 --rounds 1

Each round runs every route (``direct``, then ``pgbouncer``: transaction mode, 6 server
connections; ``--routes direct,pgbouncer,pgbouncer-named`` adds the same PgBouncer with
PHASEGATE_DATABASE_POOLER=pgbouncer, statements named by their text) on a fresh database and a
fresh queue: ``--workers`` worker processes and one ``phasegate orchestrator`` (API, outbox
relay, exporter), the chaos workload (5 phases, one write step each against the downstream test
service, bench/chaos/workload.py), runs started with back-pressure (at most ``--in-flight``
unfinished: moto rescans its queue on every call, so a deep backlog measures moto, not
phasegate). No faults are injected. After the drain: every process is stopped with SIGTERM
(exit 0 expected) and I1-I5 are checked from the database and the downstream ledger. Server
connections are sampled from pg_stat_activity.

moto answers every call in milliseconds on one core, so on a small machine both routes are
bound by the SQS emulator; the ratio says what the pooler costs on top, not AWS throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aioboto3
import asyncpg

from bench.chaos.downstream import Downstream
from bench.chaos.fleet import ROOT, Fleet, read_logs
from bench.chaos.invariants import check_all
from bench.chaos.moto_process import MotoProcess
from bench.chaos.workload import DOWNSTREAM_ENV, PHASES, chaos
from bench.common import Databases
from bench.pgbouncer import PgBouncer
from phasegate.db import create_pool
from phasegate.orchestrator.embedded import free_port, local_aws_env
from phasegate.orchestrator.starter import start_workflow
from phasegate.queue import SqsQueue, create_fifo_queue_pair
from phasegate.store import Store

ROUTES = ("direct", "pgbouncer")
# Each route's PHASEGATE_DATABASE_POOLER.
POOLER_OF = {"direct": "transaction", "pgbouncer": "transaction", "pgbouncer-named": "pgbouncer"}
VISIBILITY_S = 10


def _env(dsn: str, urls: tuple[str, str], endpoint: str, downstream: str,
         concurrency: int, pooler: str = "transaction") -> dict[str, str]:
    return {**local_aws_env(), "PHASEGATE_DATABASE_URL": dsn, "PHASEGATE_DATABASE_POOLER": pooler,
            "PHASEGATE_QUEUE_URL": urls[0], "PHASEGATE_DLQ_URL": urls[1],
            "PHASEGATE_SQS_ENDPOINT_URL": endpoint, "PHASEGATE_AWS_REGION": "us-east-1",
            "PHASEGATE_WORKFLOW_MODULES": "bench.chaos.workload",
            "PHASEGATE_CONCURRENCY": str(concurrency),
            "PHASEGATE_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S), "PHASEGATE_HEARTBEAT_S": "2",
            "PHASEGATE_WAIT_TIME_S": "1", "PHASEGATE_SHUTDOWN_GRACE_S": "10",
            "PHASEGATE_RELAY_AFTER_S": "2", "PHASEGATE_RELAY_INTERVAL_S": "0.5",
            "PHASEGATE_METRICS_PORT": "0", "PHASEGATE_METRICS_HOST": "127.0.0.1",
            "PHASEGATE_DB_POOL_MAX": "4", "PHASEGATE_LOG_FORMAT": "json",
            "PHASEGATE_LOG_LEVEL": "warning", DOWNSTREAM_ENV: downstream,
            # The API is not exercised here and binds to loopback: no tokens file.
            "PHASEGATE_API_AUTH": "none"}


def _orchestrator(env: dict[str, str], log_dir: Path) -> subprocess.Popen[bytes]:
    log = open(log_dir / "orchestrator.log", "wb")  # noqa: SIM115 - the child owns it
    process = subprocess.Popen(
        [sys.executable, "-m", "phasegate.cli", "orchestrator", "--port", str(free_port()),
         "--exporter-interval", "5"],
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, stdout=log, stderr=log)
    log.close()
    return process


async def _server_connections(admin: asyncpg.Pool, database: str) -> int:
    count: int = await admin.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", database)
    return count


async def soak_once(databases: Databases, route: str, *, runs: int, workers: int,
                    concurrency: int, in_flight: int, log_dir: Path) -> dict[str, Any]:
    direct = await databases.fresh()
    database = urlsplit(direct).path.lstrip("/")
    bouncer = PgBouncer.in_front_of(databases.server_dsn).start() \
        if route.startswith("pgbouncer") else None
    dsn = bouncer.route(direct) if bouncer else direct
    moto = MotoProcess(log_dir)
    downstream = Downstream(seed=7)
    fleet: Fleet | None = None
    orchestrator: subprocess.Popen[bytes] | None = None
    admin = await create_pool(direct, min_size=1, max_size=2, pooler="none")
    try:
        await moto.ready()
        await downstream.start()
        async with aioboto3.Session().client("sqs", endpoint_url=moto.url,
                                             region_name="us-east-1") as client:
            urls = await create_fifo_queue_pair(client, f"soak{uuid.uuid4().hex[:8]}",
                                                visibility_timeout_s=VISIBILITY_S)
        env = _env(dsn, urls, moto.url, downstream.url, concurrency, POOLER_OF[route])
        fleet = Fleet(env=env, log_dir=log_dir, kill_points=[], seed=0)
        for slot in range(workers):
            fleet.start_worker(slot, arm=False)
        orchestrator = _orchestrator(env, log_dir)
        fleet.relay = orchestrator  # stopped (SIGTERM) and its exit code read with the fleet
        started, elapsed, peak = await _drive(dsn, urls[0], moto.url, admin, database,
                                              runs=runs, in_flight=in_flight)
        # Throughput from the first to the last commit (database time): worker start-up
        # and the final drain check are not the fleet's transition rate.
        span = await admin.fetchval(
            "SELECT extract(epoch FROM max(created_at) - min(created_at))::float8 "
            "FROM checkpoints WHERE kind = 'phase'")
        codes = await asyncio.to_thread(fleet.stop_all, 60)
        results = await check_all(direct, started=started, ledger=downstream.ledger,
                                  poisons=[], faults_expected=[], faults_fired={},
                                  drain_s=0.0, drain_bound_s=1.0)
    finally:
        await admin.close()
        if fleet is not None:
            fleet.kill_everything()
        await downstream.close()
        moto.stop()
        if bouncer is not None:
            bouncer.stop()
        await databases.drop(direct)
    stats = read_logs(log_dir)
    transitions = len(started) * len(PHASES)
    exit_codes = {("orchestrator" if k == "relay" else k): v for k, v in codes.items()}
    return {"route": route, "runs": len(started), "transitions": transitions,
            "seconds": round(elapsed, 2), "commit_span_s": round(span, 2),
            "transitions_per_s": round(transitions / span, 1),
            "transitions_per_s_wall": round(transitions / elapsed, 1),
            "peak_server_connections": peak,
            "invariants": {r.name: r.ok for r in results[:5]},
            "invariant_details": [r.detail for r in results[:5] if not r.ok],
            "clean_exits": all(v == 0 for v in exit_codes.values()),
            "logged_problems": dict(stats.events), "phase_errors": dict(stats.phase_errors),
            "exit_codes": exit_codes}


async def _drive(dsn: str, queue_url: str, endpoint: str, admin: asyncpg.Pool, database: str,
                 *, runs: int, in_flight: int) -> tuple[list[str], float, int]:
    started: list[str] = []
    peak = 0
    pool = await create_pool(dsn, min_size=1, max_size=4)
    began = time.monotonic()
    try:
        async with SqsQueue(queue_url, endpoint_url=endpoint, region="us-east-1") as queue:
            store = Store(pool)
            done = 0
            while done < runs:
                done = await admin.fetchval(
                    "SELECT count(*) FROM workflow_runs WHERE status = 'completed'")
                peak = max(peak, await _server_connections(admin, database))
                room = min(in_flight - (len(started) - done), runs - len(started))
                for _ in range(max(0, room)):
                    wid = f"soak-{len(started):06d}-{uuid.uuid4().hex[:8]}"
                    await start_workflow(store, queue, workflow=chaos,
                                         input={"i": len(started)}, workflow_id=wid)
                    started.append(wid)
                if len(started) % 1000 < in_flight and room:
                    print(f"[soak {time.monotonic() - began:6.0f}s] started {len(started)}, "
                          f"completed {done}", flush=True)
                await asyncio.sleep(0.2)  # the producer's polling interval for room
            unsent = 1
            while unsent:  # drained: every successor sent (the relay's part included)
                unsent = await admin.fetchval(
                    "SELECT count(*) FROM outbox WHERE sent_at IS NULL")
                await asyncio.sleep(0.2)
    finally:
        await pool.close()
    return started, time.monotonic() - began, peak


async def soak(*, runs: int, workers: int, concurrency: int, in_flight: int, rounds: int,
               routes: list[str]) -> dict[str, Any]:
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    databases = await Databases().start()
    log_root = Path(tempfile.mkdtemp(prefix="phasegate-soak-"))
    results: list[dict[str, Any]] = []
    try:
        for round_ in range(rounds):
            for route in routes:
                print(f"round {round_ + 1}/{rounds}: {route}", flush=True)
                (log_root / f"{round_}-{route}").mkdir(parents=True)
                result = await soak_once(databases, route, runs=runs, workers=workers,
                                         concurrency=concurrency, in_flight=in_flight,
                                         log_dir=log_root / f"{round_}-{route}")
                print(json.dumps(result), flush=True)
                results.append(result)
    finally:
        await databases.stop()
    by_route = {route: statistics.median(r["transitions_per_s"] for r in results
                                         if r["route"] == route) for route in routes}
    summary: dict[str, Any] = {
        "runs": runs, "phases": len(PHASES), "workers": workers, "concurrency": concurrency,
        "rounds": rounds, "median_transitions_per_s": by_route,
        "all_invariants_hold": all(all(r["invariants"].values()) for r in results),
        "all_clean_exits": all(r["clean_exits"] for r in results), "logs": str(log_root),
        "results": results}
    if set(ROUTES) <= set(routes):
        summary["pooled_over_direct"] = round(by_route["pgbouncer"] / by_route["direct"], 2)
    if {"direct", "pgbouncer-named"} <= set(routes):
        summary["named_over_direct"] = round(by_route["pgbouncer-named"] / by_route["direct"], 2)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--routes", default=",".join(ROUTES),
                        help=f"comma-separated, of {', '.join(POOLER_OF)}")
    args = parser.parse_args(argv)
    unknown = set(args.routes.split(",")) - set(POOLER_OF)
    if unknown:
        parser.error(f"unknown route(s): {', '.join(sorted(unknown))}")
    summary = asyncio.run(soak(runs=args.runs, workers=args.workers,
                               concurrency=args.concurrency, in_flight=args.in_flight,
                               rounds=args.rounds, routes=args.routes.split(",")))
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}, indent=2))
    return 0 if summary["all_invariants_hold"] and summary["all_clean_exits"] else 1


if __name__ == "__main__":
    sys.exit(main())
