"""phasegate against a raw floor, side by side in one run.

    python -m bench.transitions            # the full run (~5 min on 2 cores)
    python -m bench.transitions --quick    # smaller workloads, fewer repetitions

For each backend (the in-process ``InMemoryFifoQueue``; moto server over HTTP in its own
process) and each number of message groups (1, 16), floor and phasegate runs alternate, each
on a fresh database, and every figure is the median over the runs, reported as
phasegate / floor. Then round trips are counted through a wire-protocol proxy (a separate pass,
so the proxy's hop is not in the timed runs), and real worker processes are measured for cold
start, idle RSS and failover. Results: ``bench/results/transitions-*.json`` and, with
``--write-docs``, ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.common import HISTORY_RUNS, ROOT, Databases, machine, moto_server, split_cores
from bench.transition_processes import cold_start_and_rss, failover
from bench.transition_round_trips import count_round_trips
from bench.transition_runs import CONCURRENCY, Env, Workload, timed_runs
from bench.transition_summary import render_table, summarise
from phasegate.db import POOLERS, Pooler
from phasegate.orchestrator.embedded import local_aws_env

RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"


def workloads_for(quick: bool, backends: list[str],
                  phases: dict[int, int] | None = None) -> list[Workload]:
    # Full sizes give the floor seconds of work per figure in-process (1 group: ~2,000
    # transitions at ~2-3k/s; 16 groups: 6,400 at ~5-8k/s); moto is ~5 ms per call, so less.
    sizes = {("memory", 1): (150, 2000), ("memory", 16): (15, 400),
             ("moto", 1): (30, 100), ("moto", 16): (4, 12)}
    # LocalStack: what one user waits between two phases of one workflow (issue 18); at 16
    # groups, the fleet's figures when every SQS call is a real HTTP request (each costs the
    # client about a millisecond of CPU in botocore, which the in-process FIFO does not). One
    # workflow of 150 phases since the `s25` runs: with 30 (before), five runs in a row of
    # one release read the wait at 0.77-1.34x the floor and client CPU at 0.86-1.44x.
    sizes[("localstack", 1)] = (30, 150)
    sizes[("localstack", 16)] = (10, 40)
    return [Workload(b, g, (phases or {}).get(g) or sizes[(b, g)][0 if quick else 1])
            for b in backends for g in (1, 16) if (b, g) in sizes]


async def bench(*, quick: bool, backends: list[str], repeats: int, process_repeats: int,
                skip_processes: bool = False, server_dsn: str | None = None,
                workloads: list[Workload] | None = None, private_server: bool = False,
                old_floor: bool = False, commit_window_ms: float | None = None,
                localstack_endpoint: str | None = None,
                phases: dict[int, int] | None = None,
                load_window_ms: float | None = None,
                continuation: bool = True, pooler: Pooler = "transaction",
                rehearsal: bool = True,
                history: int = HISTORY_RUNS, cores: str = "shared",
                floor_user_agent: str = "stock") -> dict[str, Any]:
    """Every figure, floor and phasegate alternating; returns the results document."""
    # Dummy credentials for the local SQS server (never AWS): the clients sign requests.
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    databases = await Databases(server_dsn, private=private_server, history=history).start()
    env = Env(databases, continuation=continuation, pooler=pooler, rehearsal=rehearsal,
              floor_user_agent=floor_user_agent)
    if commit_window_ms is not None:
        env.commit_window_ms = commit_window_ms
    env.localstack_endpoint = localstack_endpoint
    if load_window_ms is not None:
        env.load_window_ms = load_window_ms
    try:
        split = split_cores(databases) if cores == "split" else None
        with moto_server() as endpoint:
            env.moto_endpoint = endpoint
            workloads = workloads or workloads_for(quick, backends, phases)
            for workload in workloads:
                print(f"{workload.key}: {workload.transitions} transitions "
                      f"({workload.groups} x {workload.phases} phases), {repeats} rounds",
                      flush=True)
                await timed_runs(env, workload, repeats, old_floor)
            round_trips = {}
            for workload in workloads:
                if workload.backend == "memory":
                    round_trips[workload.key] = await count_round_trips(env, workload)
            if skip_processes:
                processes = {"floor": [{"cold_start_s": 0.0, "idle_rss_mib": 0.0}],
                             "phasegate": [{"cold_start_s": 0.0, "idle_rss_mib": 0.0}]}
                fail: dict[str, Any] = {"floor": [0.0], "phasegate": [0.0]}
            else:
                processes = await cold_start_and_rss(env, endpoint, process_repeats)
                fail = await failover(env, endpoint, process_repeats)
        summary = summarise(env, workloads, round_trips, processes, fail)
        return {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": quick,
                "private_server": databases.private, "load": os.getloadavg(),
                "repeats": repeats, "process_repeats": process_repeats,
                "concurrency": CONCURRENCY, "commit_window_ms": env.commit_window_ms,
                "load_window_ms": env.load_window_ms,
                "continuation": continuation, "pooler": pooler, "history_runs": history,
                "rehearsal": rehearsal, "cores": split or "shared",
                "floor_user_agent": floor_user_agent,
                "machine": machine(),
                "postgres": await databases.settings(), "summary": summary, "runs": env.runs}
    finally:
        await databases.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="phasegate vs a raw floor, in one run")
    parser.add_argument("--quick", action="store_true", help="small workloads, 2 rounds")
    parser.add_argument("--backends", default="memory,moto")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--process-repeats", type=int, default=None)
    parser.add_argument("--skip-processes", action="store_true")
    parser.add_argument("--label", default="", help="suffix for the results file")
    parser.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md")
    parser.add_argument("--shared-server", action="store_true",
                        help="use $PHASEGATE_BENCH_DATABASE_URL or 127.0.0.1:5432 instead of a "
                        "private cluster (WAL figures then include other clients' writes)")
    parser.add_argument("--old-floor", action="store_true",
                        help="also run the old floor (16 pollers whatever the groups)")
    parser.add_argument("--commit-window-ms", type=float, default=None,
                        help="phasegate's group commit window (default: the setting's "
                        "default; 0 = group commit off)")
    parser.add_argument("--load-window-ms", type=float, default=None,
                        help="phasegate's group load window (default: the setting's default; "
                        "0 = group load off)")
    parser.add_argument("--localstack-endpoint",
                        default=os.environ.get("PHASEGATE_BENCH_LOCALSTACK_URL"),
                        help="a running LocalStack (localstack/run-without-docker.sh) for the "
                        "localstack backend: one 150-phase workflow (the wait per hop) and 16 "
                        "workflows of 40 phases (the fleet's figures over HTTP)")
    parser.add_argument("--phases", default=None, metavar="G:N,...",
                        help="phases per workflow by number of groups, e.g. 1:300,16:60 "
                        "(a loaded machine: same ratios, less time)")
    parser.add_argument("--rehearsal", choices=("on", "off"), default="on",
                        help="before each timed run, one run of the workload's phases on the "
                        "same connections, outside the window (default on; off: the figures "
                        "carry what a connection and a phase name cost once)")
    parser.add_argument("--continuation", choices=("on", "off"), default="on",
                        help="phasegate's local continuation (PHASEGATE_CONTINUATION)")
    parser.add_argument("--pooler", choices=POOLERS, default="transaction",
                        help="phasegate's PHASEGATE_DATABASE_POOLER: transaction (default, no "
                        "statement cache), pgbouncer (statements named by their text) or none "
                        "(asyncpg's statement cache, as the floor's)")
    parser.add_argument("--history", type=int, default=HISTORY_RUNS, metavar="RUNS",
                        help="finished runs every database starts with, analyzed (default "
                        f"{HISTORY_RUNS}; 0: empty, never-analyzed databases, as before "
                        "2026-12-03)")
    parser.add_argument("--cores", choices=("shared", "split"), default="shared",
                        help="shared (default): Postgres and the benchmark on every CPU; split: "
                        "Postgres on a CPU of its own and the benchmark on the others, as a "
                        "deployment runs them on separate machines")
    parser.add_argument("--floor-user-agent", choices=("stock", "fixed"), default="stock",
                        help="the floor's SQS client: stock (default: aioboto3's defaults, "
                        "botocore's User-Agent built per request) or fixed (phasegate's fixed "
                        "User-Agent, phasegate/queue.py)")
    parser.add_argument("--log-sink", choices=("devnull", "pipe"), default="devnull",
                        help="where the worker's log lines go: devnull (default) or a pipe "
                        "another process drains, as a pod's stderr is drained by the container "
                        "runtime (each line then costs a write into the pipe)")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    process_repeats = args.process_repeats or (1 if args.quick else 3)
    _quiet_logs(args.log_sink)
    result = asyncio.run(bench(quick=args.quick, backends=args.backends.split(","),
                               repeats=repeats, process_repeats=process_repeats,
                               skip_processes=args.skip_processes,
                               private_server=not args.shared_server,
                               old_floor=args.old_floor,
                               commit_window_ms=args.commit_window_ms,
                               localstack_endpoint=args.localstack_endpoint,
                               phases=_phases(args.phases),
                               load_window_ms=args.load_window_ms,
                               continuation=args.continuation == "on",
                               pooler=args.pooler, history=args.history,
                               floor_user_agent=args.floor_user_agent,
                               rehearsal=args.rehearsal == "on", cores=args.cores))
    result["command"] = " ".join(["python -m bench.transitions", *sys.argv[1:]])
    result["log_sink"] = args.log_sink
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = f"transitions-{time.strftime('%Y%m%dT%H%M%S')}{'-' + args.label if args.label else ''}"
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"results: {path.relative_to(ROOT)}")
    print(render_table(result))
    if args.write_docs:
        from bench.report import write_docs

        write_docs(result, path)


def _phases(text: str | None) -> dict[int, int] | None:
    if not text:
        return None
    pairs = (item.split(":") for item in text.split(","))
    return {int(groups): int(count) for groups, count in pairs}


def _quiet_logs(sink: str = "devnull") -> None:
    """The worker logs as in production (JSON, info: two lines per phase), into /dev/null or,
    with ``sink="pipe"``, into a pipe that a ``cat`` of its own drains (its reads are not this
    process's CPU, as a container runtime's are not a pod's)."""
    from phasegate.logs import configure_logging

    real = sys.stderr
    if sink == "pipe":
        drain = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        assert drain.stdin is not None
        # Lives as long as the process; cat ends when the pipe closes with it.
        sys.stderr = io.TextIOWrapper(drain.stdin, encoding="utf-8", line_buffering=True)
    else:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    try:
        configure_logging("info", "json")
    finally:
        sys.stderr = real




if __name__ == "__main__":
    main()
