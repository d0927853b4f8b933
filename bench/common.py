"""Shared plumbing for the transition benchmarks: servers, databases, counters, statistics.

Everything here is measurement machinery, not phasegate: a fresh PostgreSQL database per run
(cloned from a migrated template), a moto server in its own process (so its CPU is not the
client's), and a Postgres wire-protocol proxy in its own process that counts round trips.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import platform
import pwd
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from phasegate.migrate import migrate
from phasegate.orchestrator.embedded import (
    EmbeddedPostgres,
    find_pg_bin,
    free_port,
    local_aws_env,
)

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
LOCAL_PG = "postgresql://postgres@127.0.0.1:5432/postgres"

# The floor's table: one UPSERT per transition, keyed like a checkpoint so the commit times of
# consecutive seqs can be read back exactly as phasegate's are.
FLOOR_TABLE = """
CREATE TABLE bench_floor (
    workflow_id  text NOT NULL,
    seq          integer NOT NULL,
    state        jsonb NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, seq));
CREATE TABLE bench_invocations (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id text NOT NULL, seq integer NOT NULL, worker text NOT NULL, pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
"""

# What a database in use holds besides the runs being measured, and its statistics
# (``Databases(history=N)``): N finished runs of HISTORY_PHASES phases, their checkpoints and
# sent outbox rows, and as many rows in the floor's table. On a fresh, never-analyzed database
# the planner sizes tables from a page or two, so the plans a pooled connection caches in its
# first statements scan tables that then grow through the run: a cost that grows with every
# phase committed and that a database in use (analyzed by autovacuum) never pays.
HISTORY_PREFIX = "history-"
HISTORY_PHASES = 10
HISTORY_RUNS = 2000  # the benchmarks' default (--history)
HISTORY = f"""
INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, current_phase,
                           schema_version, input, created_at, updated_at, finished_at)
SELECT '{HISTORY_PREFIX}' || r, 'history', 'completed', {HISTORY_PHASES}, NULL, 1, '{{}}',
       now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
  FROM generate_series(1, $1) r;
INSERT INTO checkpoints (workflow_id, branch, seq, phase, kind, schema_version, state,
                         state_hash, worker_id, created_at)
SELECT '{HISTORY_PREFIX}' || r, 'main', s, 'p' || s, 'phase', 1, '{{"n": 1}}', 'h', 'w',
       now() - interval '1 day'
  FROM generate_series(1, $1) r, generate_series(0, {HISTORY_PHASES - 1}) s;
INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body, created_at, sent_at)
SELECT '{HISTORY_PREFIX}' || r, 'main', s, '{HISTORY_PREFIX}' || r || '-' || s,
       '{HISTORY_PREFIX}' || r, '{{}}', now() - interval '1 day', now() - interval '1 day'
  FROM generate_series(1, $1) r, generate_series(1, {HISTORY_PHASES - 1}) s;
INSERT INTO bench_floor (workflow_id, seq, state, committed_at)
SELECT '{HISTORY_PREFIX}' || r, s, '{{"n": 1}}', now() - interval '1 day'
  FROM generate_series(1, $1) r, generate_series(0, {HISTORY_PHASES - 1}) s;
"""
# Rows of the measured runs only (read-backs of commit times, "done" checks).
MEASURED = f"workflow_id NOT LIKE '{HISTORY_PREFIX}%'"


def write_results(kind: str, report: dict[str, Any], label: str = "") -> Path:
    """``report`` as bench/results/<kind>-<its "when", compact>[-<label>].json; the path."""
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stamp = str(report["when"])[:19].replace(":", "").replace("-", "")
    path = out / f"{kind}-{stamp}{'-' + label if label else ''}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def with_database(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


def with_port(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    host = parts.hostname or "127.0.0.1"
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}:{port}"))


# -- PostgreSQL ---------------------------------------------------------------------------------


@dataclass
class PrivateCluster(EmbeddedPostgres):
    """A throwaway cluster for the benchmark alone, durable like production (fsync and full
    page writes on, unlike the embedded test server): the WAL position then moves only with
    the benchmark's own writes, so WAL bytes per transition can be read from it."""

    # More server settings (``-c name=value ...``): bench/server_statements.py preloads
    # pg_stat_statements.
    options = ""

    def start(self) -> PrivateCluster:
        pg_bin = find_pg_bin()
        self._owned_dir = tempfile.mkdtemp(prefix="phasegate-bench-pg-")
        self.data_dir = Path(self._owned_dir) / "data"
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self._owned_dir, user.pw_uid, user.pw_gid)
        self._run([str(pg_bin / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
                   "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "-N"])
        self._run([str(pg_bin / "pg_ctl"), "-D", str(self.data_dir), "-w", "-l",
                   str(Path(self._owned_dir) / "server.log"), "-o",
                   f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self._owned_dir} "
                   f"-c max_connections=200 -c shared_buffers=128MB {self.options}", "start"])
        return self


class Databases:
    """A server (a private cluster by default; an explicit DSN, $PHASEGATE_BENCH_DATABASE_URL
    or 127.0.0.1:5432 otherwise), a migrated template, and a fresh clone of it for every run."""

    def __init__(self, server_dsn: str | None = None, *, private: bool = False,
                 history: int = 0) -> None:
        self._explicit = server_dsn
        self._private = private
        self._history = history
        self._embedded: EmbeddedPostgres | None = None
        self.server_dsn = ""
        self.template = f"bench_tpl_{uuid.uuid4().hex[:10]}"
        self._created: list[str] = []

    async def start(self) -> Databases:
        dsn = self._explicit or os.environ.get("PHASEGATE_BENCH_DATABASE_URL") or LOCAL_PG
        if self._private and not self._explicit:
            self._embedded = PrivateCluster().start()
            dsn = self._embedded.dsn
        elif not self._explicit and not await _reachable(dsn):
            self._embedded = EmbeddedPostgres().start()
            dsn = self._embedded.dsn
        self.server_dsn = dsn
        await self._admin(f'CREATE DATABASE "{self.template}"')
        await migrate(with_database(dsn, self.template))
        connection = await asyncpg.connect(with_database(dsn, self.template))
        try:
            await connection.execute(FLOOR_TABLE)
            if self._history:
                # Statement by statement: asyncpg sends parameters with one statement only.
                for statement in HISTORY.split(";\n")[:-1]:
                    await connection.execute(statement, self._history)
                # The clones copy the template's statistics with its rows.
                await connection.execute("ANALYZE")
        finally:
            await connection.close()
        return self

    async def fresh(self) -> str:
        name = f"bench_{uuid.uuid4().hex[:12]}"
        await self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        self._created.append(name)
        return with_database(self.server_dsn, name)

    async def drop(self, dsn: str) -> None:
        name = urlsplit(dsn).path.lstrip("/")
        await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self._created:
            self._created.remove(name)

    async def stop(self) -> None:
        for name in [*self._created, self.template]:
            await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._created.clear()
        if self._embedded is not None:
            self._embedded.stop()

    @property
    def private(self) -> bool:
        return isinstance(self._embedded, PrivateCluster)

    @property
    def data_dir(self) -> Path | None:
        """The private cluster's data directory (its WAL: bench/wal_split.py); None for a
        server this process did not start."""
        return self._embedded.data_dir if self._embedded is not None else None

    def postmaster_pid(self) -> int | None:
        """The private cluster's postmaster (the first line of its ``postmaster.pid``)."""
        if not self.private or self._embedded is None or self._embedded.data_dir is None:
            return None
        return int((self._embedded.data_dir / "postmaster.pid").read_text().split()[0])

    async def settings(self) -> dict[str, str]:
        connection = await asyncpg.connect(self.server_dsn)
        try:
            rows = await connection.fetch(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1)",
                ["server_version", "fsync", "synchronous_commit", "shared_buffers",
                 "full_page_writes"])
        finally:
            await connection.close()
        return {r["name"]: r["setting"] for r in rows}

    async def _admin(self, sql: str) -> None:
        connection = await asyncpg.connect(self.server_dsn)
        try:
            await connection.execute(sql)
        finally:
            await connection.close()


async def _reachable(dsn: str) -> bool:
    try:
        connection = await asyncpg.connect(dsn, timeout=3)
    except Exception:
        return False
    await connection.close()
    return True


def split_cores(databases: Databases) -> dict[str, list[int]]:
    """Postgres on a core of its own, the benchmark on the others: the shape of a deployment
    (workers on their nodes, the database on its server) on one machine. The private
    cluster's processes, and the backends its postmaster forks later, are kept to the last
    CPU; this process's threads, and the processes it starts later (moto, the round-trip
    proxy), to the rest. Returns the two CPU sets for the results."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--cores split needs two CPUs or more")
    postmaster = databases.postmaster_pid()
    if postmaster is None:
        raise SystemExit("--cores split needs the private cluster (not --shared-server)")
    server, client = {cpus[-1]}, set(cpus[:-1])
    for pid in _process_tree(postmaster):
        os.sched_setaffinity(pid, server)
    for task in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(task), client)
    return {"server": sorted(server), "client": sorted(client)}


def _process_tree(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parents[int(entry)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = [root], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        tree.extend(children)
        frontier = children
    return tree


class ServerMeter:
    """Postgres' own cost of a window: the CPU of the backends serving one database (their
    time on a CPU from /proc/<pid>/schedstat, in nanoseconds, so the server must run on this
    host) and the WAL written (pg_current_wal_lsn deltas: cluster-wide, so exact only on a
    private cluster).

    Not utime + stime from /proc/<pid>/stat: those count whole clock ticks (10 ms), so a run
    of a few hundred transitions read as 0 µs or one tick (the 30-phase LocalStack workload's
    floor: 0, its ratio nan), and every figure moved in steps of a tick per run.

    Backends must live through the window: a backend that exits inside it takes its CPU along.
    Both systems open their connections before the window and close them after it.
    """

    def __init__(self, server_dsn: str, database: str) -> None:
        self.server_dsn = server_dsn
        self.database = database
        self._cpu: dict[int, float] = {}
        self._ticks: dict[int, float] = {}
        self._lsn = ""

    async def __aenter__(self) -> ServerMeter:
        self._admin = await asyncpg.connect(self.server_dsn)
        backends = await self._backend_cpu()
        self._cpu = {pid: value for pid, (_, value) in backends.items()}
        self._ticks = self._tick_cpu(list(backends))
        self._lsn = await self._admin.fetchval("SELECT pg_current_wal_lsn()::text")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._admin.close()

    async def read(self) -> dict[str, float]:
        """CPU seconds and WAL bytes since entering (backends new in the window count whole):
        the client backends' (the statements' own cost) and, apart, the autovacuum workers'
        that visited the database meanwhile (whether one comes within a short window is
        chance)."""
        wal = await self._admin.fetchval(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)", self._lsn)
        now = await self._backend_cpu()
        cpu = {kind: sum(value - self._cpu.get(pid, 0.0) for pid, value in found.items())
               for kind, found in self._by_kind(now).items()}
        ticks = sum(value - self._ticks.get(pid, 0.0) for pid, value in self._tick_cpu(
            [pid for pid, (kind, _) in now.items() if not kind.startswith("autovacuum")]).items())
        return {"server_cpu_s": cpu["client"], "autovacuum_cpu_s": cpu["autovacuum"],
                "server_cpu_ticks_s": ticks, "wal_bytes": float(wal),
                "backends": float(len(now))}

    @staticmethod
    def _tick_cpu(pids: list[int]) -> dict[int, float]:
        """The same backends' utime + stime in whole clock ticks, as results up to the
        ``final4-*`` runs read them (kept beside the figure, so one run shows both)."""
        found = {}
        for pid in pids:
            seconds = stat_cpu_s(pid)
            if seconds is not None:
                found[pid] = seconds
        return found

    def _by_kind(self, now: dict[int, tuple[str, float]]) -> dict[str, dict[int, float]]:
        found: dict[str, dict[int, float]] = {"client": {}, "autovacuum": {}}
        for pid, (kind, value) in now.items():
            found["autovacuum" if kind.startswith("autovacuum") else "client"][pid] = value
        return found

    async def _backend_cpu(self) -> dict[int, tuple[str, float]]:
        rows = await self._admin.fetch(
            "SELECT pid, coalesce(backend_type, '') AS kind FROM pg_stat_activity "
            "WHERE datname = $1", self.database)
        found = {}
        for row in rows:
            seconds = process_cpu_s(row["pid"])
            if seconds is not None:
                found[row["pid"]] = (row["kind"], seconds)
        return found


TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float | None:
    """A single-threaded process's CPU time so far (a Postgres backend; schedstat counts its
    one task): schedstat's time on a CPU in ns, or where the kernel keeps no scheduler
    statistics, utime + stime in clock ticks. None when the process is gone or not on this
    host."""
    try:
        with open(f"/proc/{pid}/schedstat") as handle:
            return int(handle.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return stat_cpu_s(pid)


def stat_cpu_s(pid: int) -> float | None:
    """utime + stime of /proc/<pid>/stat (its 14th and 15th fields), whole clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * TICK_S


# -- processes: moto server, round-trip proxy ---------------------------------------------------


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@contextmanager
def moto_server() -> Iterator[str]:
    """moto as a separate OS process over HTTP; yields its endpoint URL."""
    port = free_port()
    process = subprocess.Popen(
        [str(VENV_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ,
                                                                  **local_aws_env()})
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass
class RoundTripProxy:
    """``bench/pgcount.py`` in its own process between the client and PostgreSQL."""

    upstream_port: int
    port: int = field(default_factory=free_port)
    control_port: int = field(default_factory=free_port)
    _process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RoundTripProxy:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.pgcount", str(self.port), str(self.upstream_port),
             str(self.control_port)], cwd=ROOT, stdout=subprocess.DEVNULL)
        wait_port(self.port)
        wait_port(self.control_port)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)

    async def counts(self) -> dict[str, int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.control_port)
        data = await reader.read()
        writer.close()
        return dict(json.loads(data))


# -- statistics ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def commit_figures(rows: Sequence[Any]) -> dict[str, float]:
    """Throughput and transition latency from commit times: (workflow_id, seq, epoch) rows.

    Latency of a transition = commit time of seq n+1 minus commit time of seq n of the same
    workflow: the whole cycle send -> receive -> check -> run -> commit. Throughput = commits
    after the first / (last commit - first commit).
    """
    by_workflow: dict[str, list[tuple[int, float]]] = {}
    for workflow_id, seq, at in rows:
        by_workflow.setdefault(workflow_id, []).append((seq, at))
    gaps: list[float] = []
    for commits in by_workflow.values():
        commits.sort()
        gaps += [b[1] - a[1] for a, b in itertools.pairwise(commits)]
    times = [at for _, _, at in rows]
    span = max(times) - min(times) if times else 0.0
    return {
        "transitions_per_s": (len(rows) - 1) / span if span > 0 else float("nan"),
        "latency_p50_ms": percentile(gaps, 50) * 1000,
        "latency_p99_ms": percentile(gaps, 99) * 1000,
    }


def machine() -> dict[str, Any]:
    cpu = ""
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpus": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "python": platform.python_version(), "platform": platform.platform()}


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
