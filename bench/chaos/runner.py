"""One chaos run: real servers, a worker fleet, a seeded fault schedule, invariants at the end.

Layout (all on 127.0.0.1):

    workers (N processes) ─┬─ SQS fault proxy ──▶ moto server (its own process)
    relay (1 process)  ────┤
                           └─ commit-cut proxy ─▶ throwaway PostgreSQL (restarted -m immediate)
    workers ──▶ downstream test service (records every effect attempt by idempotency key)

The runner starts the workflows at a steady pace over the fault window (each run's kind, id and
start: bench/chaos/mix.py), fires the schedule, restarts workers that die, waits for the system
to drain, stops everything with SIGTERM and checks the invariants (bench/chaos/invariants.py;
I10, I12 and I11: bench/chaos/keyed.py, waits.py).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aioboto3
import asyncpg

from bench.chaos.config import ChaosConfig
from bench.chaos.downstream import Downstream
from bench.chaos.fleet import FAULT_LINE, Fleet, LogStats, read_logs
from bench.chaos.inject import MAX_MESSAGE_BYTES, SHUTDOWN_GRACE_S, Injector
from bench.chaos.invariants import DATABASE_ERRORS, Result, SentPoison, check_all
from bench.chaos.keyed import SlotWatch, keyed_results
from bench.chaos.mix import plan_run
from bench.chaos.moto_process import MotoProcess
from bench.chaos.pg_proxy import PgCommitCutProxy
from bench.chaos.schedule import SQS_FAULTS, build_schedule, kill_points
from bench.chaos.sqs_proxy import SqsFaultProxy
from bench.chaos.waits import SignalSender, i11_waits_kept
from bench.chaos.workload import DOWNSTREAM_ENV, PHASES
from bench.pgbouncer import PgBouncer
from phasegate.migrate import migrate
from phasegate.orchestrator.embedded import EmbeddedPostgres, local_aws_env
from phasegate.queue import SqsQueue, create_fifo_queue_pair
from phasegate.store import Store, create_pool

VISIBILITY_S = 4
MAX_UNFINISHED = 150  # runs started but not completed, at most (the producer waits)
MAX_RECEIVE_COUNT = 50  # the documented production redrive policy (phasegate/queue.py)


@dataclass
class Report:
    config: ChaosConfig
    results: list[Result]
    fired: dict[str, int]
    stats: dict[str, Any]
    schedule_text: str
    log_dir: Path
    duration_s: float
    exit_codes: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def text(self) -> str:
        lines = [f"chaos seed={self.config.seed} workflows={self.config.workflows} "
                 f"workers={self.config.workers} long={self.config.long}: "
                 f"{'PASS' if self.ok else 'FAIL'} in {self.duration_s:.1f}s"]
        lines += [f"  [{'ok' if r.ok else 'FAIL'}] {r.name}: {r.detail}" for r in self.results]
        lines += [f"  {k}: {v}" for k, v in self.stats.items()]
        lines.append(f"  logs: {self.log_dir}")
        if not self.ok:
            lines += ["", f"reproduce: python -m bench.chaos --seed {self.config.seed} "
                      f"--workflows {self.config.workflows} --workers {self.config.workers}"
                      + (" --long" if self.config.long else "")
                      + (f" --branching {self.config.branching_every}"
                         if self.config.branching_every else "")
                      + (f" --keyed {self.config.keyed_every}" if self.config.keyed_every
                         else "")
                      + (f" --waits {self.config.wait_every}" if self.config.wait_every else "")
                      + (" --pgbouncer" if self.config.pgbouncer else "")
                      + ("" if self.config.continuation else " --continuation off")
                      + ("" if self.config.pooler == "transaction"
                         else f" --pooler {self.config.pooler}"),
                      "fault schedule:",
                      self.schedule_text]
        return "\n".join(lines)


class ChaosRun:
    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        self.schedule = build_schedule(config.seed, workflows=config.workflows,
                                       workers=config.workers, long=config.long,
                                       continuation=config.continuation)
        self.rng = random.Random(config.seed ^ 0x5EED)
        self.fired: Counter[str] = Counter()
        self.started: list[str] = []
        self.poisons: list[SentPoison] = []
        self.last_fault = 0.0
        self.t0 = 0.0
        self.sigterm_codes: list[int] = []
        self.drain_seconds: list[float] = []
        self.production_s = 0.0
        self.slots = SlotWatch()
        self.signals = SignalSender(random.Random(config.seed ^ 0x516))

    def say(self, text: str) -> None:
        print(f"[chaos {time.monotonic() - self.t0:7.1f}s] {text}", flush=True)

    async def run(self) -> Report:
        config = self.config
        log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix=f"chaos-{config.seed}-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "schedule.json").write_text(self.schedule.to_json())
        began = time.monotonic()
        self.t0 = began
        os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
        pg = EmbeddedPostgres()
        await asyncio.to_thread(pg.start)
        moto = MotoProcess(log_dir)
        seed = config.seed
        sqs_proxy = SqsFaultProxy("", seed=seed + 1)
        bouncer = PgBouncer(pg.port) if config.pgbouncer else None
        pg_proxy = PgCommitCutProxy(bouncer.port if bouncer else pg.port, seed=seed + 2,
                                    probability=self.schedule.pg_commit_cut_probability)
        downstream = Downstream(seed=seed + 3, response_lost_probability=0.005)
        fleet: Fleet | None = None
        try:
            await moto.ready()
            if bouncer is not None:
                await asyncio.to_thread(bouncer.start)
                self.say(f"through {bouncer.version()} in transaction mode "
                         f"({'tracking' if bouncer.tracks_prepared_statements else 'not tracking'}"
                         " named statements), pooler mode "
                         f"{self.config.pooler}")
            sqs_proxy.upstream = moto.url
            await sqs_proxy.start()
            await pg_proxy.start()
            await downstream.start()
            await migrate(pg.dsn)
            session = aioboto3.Session()
            async with session.client("sqs", endpoint_url=moto.url,
                                      region_name="us-east-1") as client:
                queue_url, dlq_url = await create_fifo_queue_pair(
                    client, f"chaos{uuid.uuid4().hex[:8]}", visibility_timeout_s=VISIBILITY_S,
                    max_receive_count=MAX_RECEIVE_COUNT)
                fleet = Fleet(env=self._worker_env(pg_proxy, sqs_proxy, downstream, queue_url,
                                                   dlq_url),
                              log_dir=log_dir, kill_points=self.schedule.kill_points,
                              seed=seed)
                self.say(self.schedule.describe().splitlines()[0])
                fleet.start_relay()
                for slot in range(config.workers):
                    fleet.start_worker(slot)
                pool = await create_pool(pg.dsn, min_size=0, max_size=4)
                try:
                    drain_s = await self._drive(fleet, pg, pg_proxy, sqs_proxy, downstream,
                                                client, queue_url, pool)
                finally:
                    await pool.close()
                    exit_codes = await asyncio.to_thread(fleet.stop_all)
            fired = self._collect_fired(fleet, pg_proxy, sqs_proxy, downstream, log_dir)
            results = await check_all(
                pg.dsn, started=self.started, ledger=downstream.ledger, poisons=self.poisons,
                faults_expected=self._expected_faults(), faults_fired=fired,
                drain_s=drain_s, drain_bound_s=config.drain_bound_s)
            results.append(self._clean_stops(fleet, exit_codes))
            results.extend(await keyed_results(pg.dsn, self.slots, self.started))
            if self.signals.answers:
                results.append(await i11_waits_kept(pg.dsn, self.signals))
            results.append(budget_charged_only_by_phase_errors(read_logs(log_dir)))
            stats = self._stats(log_dir, downstream, began)
        finally:
            if fleet is not None:
                fleet.kill_everything()
            await sqs_proxy.close()
            await pg_proxy.close()
            await downstream.close()
            moto.stop()
            if bouncer is not None:
                bouncer.stop()
            await asyncio.to_thread(pg.stop)
        report = Report(config=config, results=results, fired=dict(fired), stats=stats,
                        schedule_text=self.schedule.describe(), log_dir=log_dir,
                        duration_s=time.monotonic() - began, exit_codes=exit_codes)
        (log_dir / "report.txt").write_text(report.text())
        return report

    def _worker_env(self, pg_proxy: PgCommitCutProxy, sqs_proxy: SqsFaultProxy,
                    downstream: Downstream, queue_url: str, dlq_url: str) -> dict[str, str]:
        return {**local_aws_env(), "PHASEGATE_DATABASE_URL": pg_proxy.dsn(),
                "PHASEGATE_QUEUE_URL": queue_url, "PHASEGATE_DLQ_URL": dlq_url,
                "PHASEGATE_SQS_ENDPOINT_URL": sqs_proxy.endpoint_url,
                "PHASEGATE_AWS_REGION": "us-east-1",
                "PHASEGATE_WORKFLOW_MODULES": "bench.chaos.workload",
                "PHASEGATE_CONCURRENCY": str(self.config.concurrency),
                "PHASEGATE_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S),
                "PHASEGATE_HEARTBEAT_S": "1", "PHASEGATE_WAIT_TIME_S": "1",
                "PHASEGATE_SHUTDOWN_GRACE_S": str(SHUTDOWN_GRACE_S),
                "PHASEGATE_RETRY_BACKOFF_S": "0.5",
                # PHASEGATE_MAX_ATTEMPTS stays at its default (5): the retry budget a phase
                # has in production is part of what the faults must not exhaust.
                "PHASEGATE_RETRY_BACKOFF_MAX_S": "4",
                "PHASEGATE_MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
                "PHASEGATE_RELAY_AFTER_S": "2", "PHASEGATE_RELAY_INTERVAL_S": "0.5",
                # Longer than anything legitimately idle here (a 6 s phase, a 4 s backoff,
                # an 18 s SQS outage): a run idle longer lost its message.
                "PHASEGATE_RELAY_STALL_AFTER_S": "25",
                "PHASEGATE_METRICS_PORT": "0", "PHASEGATE_METRICS_HOST": "127.0.0.1",
                "PHASEGATE_STARTUP_TIMEOUT_S": "60", "PHASEGATE_LOG_FORMAT": "json",
                "PHASEGATE_DB_POOL_MAX": "4", DOWNSTREAM_ENV: downstream.url,
                "PHASEGATE_CONTINUATION": "true" if self.config.continuation else "false",
                "PHASEGATE_DATABASE_POOLER": self.config.pooler}

    # -- driving the run ------------------------------------------------------------------------

    async def _drive(self, fleet: Fleet, pg: EmbeddedPostgres, pg_proxy: PgCommitCutProxy,
                     sqs_proxy: SqsFaultProxy, downstream: Downstream, client: Any,
                     queue_url: str, pool: asyncpg.Pool) -> float | None:
        window = self.schedule.fault_window_s
        start = time.monotonic()
        self.t0 = start
        injector = Injector(run=self, fleet=fleet, pg=pg, pg_proxy=pg_proxy,
                            sqs_proxy=sqs_proxy, downstream=downstream, client=client,
                            queue_url=queue_url, pool=pool)
        producer = asyncio.create_task(self._produce(pool, queue_url, window * 0.8))
        watched = asyncio.Event()
        watch = asyncio.create_task(self.slots.watch(pool, lambda: time.monotonic() - start,
                                                     watched))
        events = list(self.schedule.events)
        background: set[asyncio.Task[None]] = set()
        last_progress = 0.0
        window_over = False
        restarts: list[asyncio.Task[None]] = []
        while not (window_over and producer.done()):
            now = time.monotonic() - start
            while events and events[0].at_s <= now:
                task = asyncio.create_task(injector.fire(events.pop(0)))
                background.add(task)
                task.add_done_callback(background.discard)
            for worker in fleet.reap():
                self.last_fault = time.monotonic()
                self.say(f"worker {worker.slot}.{worker.incarnation} died "
                         f"({worker.faults or 'no armed point'}); restarted")
            if not window_over and now >= window and not events:
                # The fault window is over: no more proxy faults or scheduled events.
                window_over = True
                await asyncio.gather(*background)
                pg_proxy.enabled = False
                downstream.response_lost_probability = 0.0
                self.last_fault = max(self.last_fault, time.monotonic())
                self.say(f"fault window over ({len(self.started)} runs started in it)")
                # A slow fleet may not have reached every kill point's N: each kind that
                # never fired is armed at its first hit, by restarting a worker for it.
                restarts = [asyncio.create_task(injector.restart(slot))
                            for slot in fleet.end_window()]
                if fleet.pending:
                    self.say(f"never fired yet, armed again: {', '.join(fleet.pending)}")
            if now - last_progress > 5:
                last_progress = now
                await self._progress(pool, fleet)
            await asyncio.sleep(0.1)  # the schedule's clock tick, not a synchronisation
        producer.result()
        await self.signals.finished()
        self.say("all runs started; waiting for the system to drain")
        drained = await self._wait_drained(fleet, pool, client, queue_url, restarts)
        self.production_s = time.monotonic() - start
        watched.set()
        await watch
        return drained

    async def _produce(self, pool: asyncpg.Pool, queue_url: str, over_s: float) -> None:
        store = Store(pool)
        total = self.config.workflows
        session_queue = SqsQueue(queue_url, endpoint_url=self._moto_url(queue_url),
                                 region="us-east-1")
        async with session_queue as queue:
            for i in range(total):
                plan = plan_run(i, self.config)
                due = self.t0 + over_s * i / total
                delay = due - time.monotonic()
                if delay > 0 and plan.paced:
                    await asyncio.sleep(delay)  # the production pace of the schedule
                await self._backpressure(pool)
                wid = plan.workflow_id(self.config.seed, self.rng.getrandbits(32))
                while True:
                    try:
                        await plan.start(store, queue, wid)
                        break
                    except DATABASE_ERRORS:
                        await asyncio.sleep(0.2)  # Postgres is restarting: retry shortly
                self.started.append(wid)
                if plan.signalled:
                    self.signals.schedule(pool, wid)

    async def _backpressure(self, pool: asyncpg.Pool) -> None:
        """At most MAX_UNFINISHED runs in flight: moto rescans its queue on every call, so a
        backlog slows every call and the backlog grows; a real producer meets the same
        limit as queue depth."""
        while len(self.started) >= MAX_UNFINISHED:
            try:
                done = await pool.fetchval("SELECT count(*) FROM workflow_runs "
                                           "WHERE status = 'completed'")
            except DATABASE_ERRORS:
                done = 0
            if len(self.started) - done < MAX_UNFINISHED:
                return
            await asyncio.sleep(0.5)  # polling the database for room

    @staticmethod
    def _moto_url(queue_url: str) -> str:
        parts = queue_url.split("/")
        return "/".join(parts[:3])

    # -- the faults -----------------------------------------------------------------------------

    # -- waiting and reporting ------------------------------------------------------------------

    async def _progress(self, pool: asyncpg.Pool, fleet: Fleet) -> None:
        try:
            rows = await pool.fetch("SELECT status, count(*) AS n FROM workflow_runs GROUP BY 1")
        except DATABASE_ERRORS:
            return
        counts = ", ".join(f"{r['status']}={r['n']}" for r in rows)
        self.say(f"started {len(self.started)}/{self.config.workflows}: {counts}; "
                 f"workers alive {fleet.alive()}")

    async def _wait_drained(self, fleet: Fleet, pool: asyncpg.Pool, client: Any,
                            queue_url: str, restarts: list[asyncio.Task[None]]
                            ) -> float | None:
        """Polls until the system is drained and no restart is under way; returns the seconds
        since the last fault (I7), or None past the deadline."""
        deadline = time.monotonic() + self.config.drain_bound_s * 2
        last_progress = time.monotonic()
        while time.monotonic() < deadline:
            for worker in fleet.reap():
                self.last_fault = time.monotonic()
                self.say(f"worker {worker.slot}.{worker.incarnation} died after the window "
                         f"({worker.faults}); restarted")
            if all(t.done() for t in restarts) and await self._drained(pool, client, queue_url):
                for task in restarts:
                    task.result()  # a restart that failed fails the run
                return time.monotonic() - self.last_fault
            if time.monotonic() - last_progress > 5:
                last_progress = time.monotonic()
                await self._progress(pool, fleet)
            await asyncio.sleep(0.25)  # polling interval of a deadline-bounded wait
        return None

    async def _drained(self, pool: asyncpg.Pool, client: Any, queue_url: str) -> bool:
        try:
            done = await pool.fetchval("SELECT count(*) FROM workflow_runs WHERE workflow_id = "
                                       "ANY($1) AND status = 'completed'", self.started)
            unsent = await pool.fetchval("SELECT count(*) FROM outbox WHERE sent_at IS NULL")
        except DATABASE_ERRORS:
            return False
        if done != len(self.started) or unsent:
            return False
        attrs = (await client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed"]))["Attributes"]
        return sum(int(v) for v in attrs.values()) == 0

    def _expected_faults(self) -> list[str]:
        kinds = {e.kind for e in self.schedule.events}
        expected = [*(f"kill@{p}" for p in kill_points(self.config.continuation)),
                    "sigkill_worker", "sigterm_drain",
                    "sigkill_relay",
                    "pg_restart", "pg_commit_cut", *(f"sqs_{f}" for f in SQS_FAULTS),
                    "duplicate_after_window", "duplicate_in_window", "poison",
                    "downstream_response_lost"]
        if "pg_restart" not in kinds:
            expected.remove("pg_restart")
        return expected

    def _collect_fired(self, fleet: Fleet, pg_proxy: PgCommitCutProxy,
                       sqs_proxy: SqsFaultProxy, downstream: Downstream,
                       log_dir: Path) -> Counter[str]:
        fired = Counter(self.fired)
        for point, n in read_logs(log_dir).fault_points.items():
            fired[f"kill@{point}"] += n
        fired["pg_commit_cut"] = pg_proxy.cuts["phase_commit"]
        fired["pg_step_record_cut"] = pg_proxy.cuts["step_claim"] + pg_proxy.cuts["step_complete"]
        for kind, n in sqs_proxy.fired.items():
            fired[f"sqs_{kind}"] += n
        fired["downstream_response_lost"] = downstream.responses_lost
        return fired

    def _clean_stops(self, fleet: Fleet, exit_codes: dict[str, int]) -> Result:
        """Every process ends by a SIGTERM drain (exit 0) or by an injected SIGKILL; any
        other death (a crash at startup, an exception) fails the run."""
        bad = {k: v for k, v in exit_codes.items() if v != 0}
        bad_drains = [c for c in self.sigterm_codes if c != 0]
        crashed = [f"w{w.slot}.{w.incarnation}:{code}" for w, code in fleet.finished
                   if w.expected_exit is None and not (
                       code == -signal.SIGKILL
                       and FAULT_LINE.search(w.log.read_text(errors="replace")))]
        ok = not bad and not bad_drains and not crashed
        return Result("processes end only by a clean SIGTERM drain or an injected kill", ok,
                      f"{len(exit_codes)} processes at the end, {len(self.sigterm_codes)} "
                      "mid-run drains" + (f"; non-zero: {bad} {bad_drains}"
                                          if bad or bad_drains else "")
                      + (f"; crashed: {crashed[:5]} (see their logs)" if crashed else ""))

    def _stats(self, log_dir: Path, downstream: Downstream, began: float) -> dict[str, Any]:
        logs = read_logs(log_dir)
        attempts = Counter((a.workflow_id, a.seq) for a in downstream.ledger.attempts)
        redone = sum(n - 1 for n in attempts.values())
        transitions = len(self.started) * len(PHASES)
        first: dict[tuple[str, int], float] = {}
        for a in downstream.ledger.attempts:
            first.setdefault((a.workflow_id, a.seq), a.at)
        # A phase still running on a worker that lost its lease after the run moved on: its
        # commit is refused and its effect deduplicated by key.
        stale = sum(1 for a in downstream.ledger.attempts
                    if (a.workflow_id, a.seq + 1) in first
                    and a.at > first[(a.workflow_id, a.seq + 1)])
        return {
            "phase transitions": transitions,
            "throughput": f"{transitions / max(1e-9, self.production_s):.1f} "
                          "phase transitions/s (start of production to drained)",
            "phase outcomes (worker logs)": dict(sorted(logs.outcomes.items())),
            "phase executions with an effect attempt": sum(attempts.values()),
            "redone executions (same key again)": redone,
            "stale executions (after the run moved on)": stale,
            "worker events": dict(sorted(logs.events.items())),
            "SIGTERM drain durations (s)": sorted(self.drain_seconds),
            "wall time": f"{time.monotonic() - began:.1f}s",
        }


def budget_charged_only_by_phase_errors(logs: LogStats) -> Result:
    """A phase's retry budget (PHASEGATE_MAX_ATTEMPTS) is for the phase's own errors; the
    workload raises only DownstreamError, so any other charged error is phasegate's own
    infrastructure (its database, its queue) being billed to the phase."""
    foreign = {k: v for k, v in logs.phase_errors.items() if k != "DownstreamError"}
    return Result("retry budget charged only by the phase's own errors", not foreign,
                  f"phase errors by type: {dict(logs.phase_errors) or 'none'}"
                  + (f"; charged for infrastructure faults: {foreign}" if foreign else ""))


def run_chaos(config: ChaosConfig) -> Report:
    return asyncio.run(ChaosRun(config).run())


def cleanup_logs(report: Report) -> None:
    if report.ok:
        shutil.rmtree(report.log_dir, ignore_errors=True)


