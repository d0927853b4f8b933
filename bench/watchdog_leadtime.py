"""How much warning the memory watchdog gets before the OOM kill, and how long a flush takes.

Each run puts one real worker process in a memory-limited cgroup (tests/cgroup_sandbox.py)
and starts a workflow that dies there by OOM kill:

- ``leak``: the phase reads a large file after evicting it (reclaim pressure PSI sees) while
  its heap grows at ``--leak-mb-per-s`` until the kernel kills it;
- ``spike``: the phase allocates 512 MiB at memset speed.

Lead time = the kill (seen by this process's waitpid poll, 5 ms granularity) minus the first
pressure event (the watchdog's wall-clock ``event_at``); flush duration = the worker's own
``emergency_flush`` ``duration_s``. Needs root; uses 127.0.0.1:5432 (or
$PHASEGATE_TEST_DATABASE_URL) and an in-process moto SQS server.

    .venv/bin/python -m bench.watchdog_leadtime --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from phasegate.migrate import migrate  # noqa: E402
from phasegate.orchestrator.embedded import EmbeddedSqs, local_aws_env  # noqa: E402
from phasegate.orchestrator.starter import start_workflow  # noqa: E402
from tests import workflows_pressure  # noqa: E402
from tests.cgroup_sandbox import CgroupSandbox, log_events  # noqa: E402
from tests.conftest import TEST_TABLES, with_database  # noqa: E402
from tests.helpers import create_queues, make_settings, queue_for, store_for  # noqa: E402

MiB = 1 << 20


async def fresh_database(server: str) -> str:
    name = f"phasegate_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = with_database(server, name)
    await migrate(dsn)
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(TEST_TABLES)
    finally:
        await connection.close()
    return dsn


async def drop_database(server: str, dsn: str) -> None:
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{dsn.rsplit("/", 1)[1]}" WITH (FORCE)')
    finally:
        await admin.close()


async def wait_until(predicate: Any, limit_s: float, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval)
    return False


async def one_run(kind: str, server: str, sqs: str, big_file: str, work: Path,
                  args: argparse.Namespace) -> dict[str, Any]:
    dsn = await fresh_database(server)
    os.environ["PHASEGATE_DATABASE_URL"] = dsn  # the test workflows' ledger
    try:
        queues = await create_queues(sqs, f"b{uuid.uuid4().hex[:12]}")
        settings = make_settings(dsn, queues, sqs)
        log_path = work / f"{kind}-{uuid.uuid4().hex[:6]}.log"
        with CgroupSandbox.create("phasegate-bench") as box:
            worker = box.spawn_worker(settings, modules="tests.workflows_pressure",
                                      log_path=log_path)
            if not await wait_until(lambda: bool(log_events(log_path, "worker_ready")), 60, 0.05):
                raise RuntimeError(f"worker not ready:\n{log_path.read_text()[-2000:]}")
            box.set_limit(box.usage() + args.room_mb * MiB)
            async with store_for(dsn) as store, queue_for(settings) as queue:
                if kind == "leak":
                    await start_workflow(store, queue, workflow=workflows_pressure.leak, input={
                        "file": big_file, "gate": str(work / "never"),
                        "leak_mb_per_s": args.leak_mb_per_s})
                else:
                    await start_workflow(store, queue, workflow=workflows_pressure.spike,
                                         input={"spike_mb": 512})
            started = time.time()
            died = await wait_until(lambda: worker.poll() is not None, args.timeout)
            killed_at = time.time()
            if not died:
                worker.kill()
                worker.wait()
            oom_kills = box.oom_kills()
        flushes = log_events(log_path, "emergency_flush")
        saved = await asyncpg_fetchval(dsn, "SELECT count(*) FROM checkpoints "
                                       "WHERE kind = 'emergency'")
        first = flushes[0] if flushes else None
        return {
            "kind": kind, "oom_killed": died and worker.returncode == -9 and oom_kills > 0,
            "seconds_to_kill": round(killed_at - started, 3),
            "warned": first is not None,
            "first_reason": first["reason"] if first else None,
            "lead_time_s": round(killed_at - first["event_at"], 3) if first else 0.0,
            "flushes": len(flushes), "reasons": [f["reason"] for f in flushes],
            "flush_duration_s": [f["duration_s"] for f in flushes],
            "emergency_checkpoints": saved,
        }
    finally:
        await drop_database(server, dsn)


async def asyncpg_fetchval(dsn: str, sql: str) -> Any:
    connection = await asyncpg.connect(dsn)
    try:
        return await connection.fetchval(sql)
    finally:
        await connection.close()


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("leak", "spike"):
        mine = [r for r in runs if r["kind"] == kind]
        if not mine:
            continue
        leads = [r["lead_time_s"] for r in mine if r["warned"]]
        durations = [d for r in mine for d in r["flush_duration_s"]]
        out[kind] = {
            "runs": len(mine), "oom_killed": sum(r["oom_killed"] for r in mine),
            "warned": len(leads),
            "first_reasons": sorted({r["first_reason"] for r in mine if r["first_reason"]}),
            "lead_time_s": _stats(leads), "flush_duration_s": _stats(durations),
            "emergency_checkpoints": [r["emergency_checkpoints"] for r in mine]}
    return out


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {"min": ordered[0], "median": round(statistics.median(ordered), 6),
            "max": ordered[-1], "n": len(ordered)}


def write_file(path: str, size_mb: int) -> None:
    block = os.urandom(MiB)
    with open(path, "wb") as f:
        for _ in range(size_mb):
            f.write(block)


def write_report(out: Path, report: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"watchdog_leadtime-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="leak runs (spike: ceil(runs/2))")
    parser.add_argument("--room-mb", type=int, default=96,
                        help="limit = idle worker usage + this")
    parser.add_argument("--leak-mb-per-s", type=float, default=16.0)
    parser.add_argument("--file-mb", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    server = os.environ.get("PHASEGATE_TEST_DATABASE_URL",
                            "postgresql://postgres@127.0.0.1:5432/postgres")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, EmbeddedSqs() as sqs:
        work = Path(tmp)
        big_file = str(work / "pressure.bin")
        write_file(big_file, args.file_mb)
        plan = ["leak"] * args.runs + ["spike"] * ((args.runs + 1) // 2)
        for i, kind in enumerate(plan):
            result = await one_run(kind, server, sqs.endpoint_url, big_file, work, args)
            runs.append(result)
            print(f"[{i + 1}/{len(plan)}] {json.dumps(result)}", flush=True)
    report = {"command": " ".join(["python -m bench.watchdog_leadtime", *sys.argv[1:]]),
              "host": {"kernel": platform.release(), "cpus": os.cpu_count(),
                       "python": platform.python_version()},
              "settings": {"room_mb": args.room_mb, "leak_mb_per_s": args.leak_mb_per_s,
                           "file_mb": args.file_mb, "watchdog": "defaults"},
              "summary": summarize(runs), "runs": runs}
    path = write_report(Path(args.out), report)
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    asyncio.run(main())
