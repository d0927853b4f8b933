"""The OS processes of a chaos run: worker processes (each armed with one kill point), the
outbox relay, and the moto SQS server. Workers are restarted when they die.

Kill points are armed in the schedule's order as ``point@N`` while the fault window lasts.
A slow fleet may not reach every N before the window ends, so then each kind that never
fired is armed once more as ``point@1`` (``end_window``): I6 holds on a loaded machine
without a weaker check."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAULT_LINE = re.compile(r"phasegate: fault injection: SIGKILL at (\w+)")


def point_kind(point: str) -> str:
    """``step_effect@7`` -> ``step_effect``."""
    return point.partition("@")[0]


@dataclass
class WorkerProcess:
    slot: int
    incarnation: int
    faults: str
    process: subprocess.Popen[bytes]
    log: Path
    expected_exit: str | None = None  # "sigkill" / "sigterm" when the runner ends it
    started_at: float = field(default_factory=time.monotonic)


@dataclass
class Fleet:
    env: dict[str, str]
    log_dir: Path
    kill_points: list[str]
    seed: int
    window_over: bool = False  # then only never-fired kinds are armed, each at its first hit
    workers: dict[int, WorkerProcess] = field(default_factory=dict)
    finished: list[tuple[WorkerProcess, int]] = field(default_factory=list)
    relay: subprocess.Popen[bytes] | None = None
    fired_points: set[str] = field(default_factory=set)
    _relays: int = 0
    _pending: list[str] = field(default_factory=list)
    _incarnations: Counter[int] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._pending = list(self.kill_points)

    @property
    def pending(self) -> list[str]:
        """The kill points the next armed starts take, in order."""
        return list(self._pending)

    def _spawn(self, args: list[str], name: str, extra: dict[str, str]
               ) -> tuple[subprocess.Popen[bytes], Path]:
        path = self.log_dir / f"{name}.log"
        log = open(path, "wb")  # noqa: SIM115 - the child owns it; closed when we exit
        env = {**os.environ, **self.env, "PYTHONPATH": str(ROOT), **extra}
        process = subprocess.Popen([sys.executable, "-m", "phasegate.cli", *args], env=env,
                                   cwd=ROOT, stdout=log, stderr=log)
        log.close()
        return process, path

    def start_relay(self) -> None:
        self._relays += 1
        self.relay, _ = self._spawn(["relay"], f"relay-{self._relays}", {})

    def start_worker(self, slot: int, *, arm: bool = True) -> WorkerProcess:
        """Start (or restart) the worker in ``slot``, armed with the next kill point if
        ``arm``. Runner-initiated restarts arm; a restart after a kill point fired arms only
        while some point has never fired yet, so kills stay paced by the schedule."""
        self._incarnations[slot] += 1
        incarnation = self._incarnations[slot]
        faults = self.take_point() if arm else ""
        process, path = self._spawn(["worker"], f"worker-{slot}-{incarnation}", {
            "PHASEGATE_WORKER_ID": f"w{slot}.{incarnation}", "PHASEGATE_FAULTS": faults,
            "PHASEGATE_FAULT_SEED": str(self.seed * 1000 + slot * 100 + incarnation)})
        worker = WorkerProcess(slot, incarnation, faults, process, path)
        self.workers[slot] = worker
        return worker

    def take_point(self) -> str:
        """The next queued kill point ("" when none), for a worker about to start."""
        return self._pending.pop(0) if self._pending else ""

    def reap(self) -> list[WorkerProcess]:
        """Workers that exited on their own (a fault point fired); restarts them."""
        dead = []
        for slot, worker in list(self.workers.items()):
            code = worker.process.poll()
            if code is not None and worker.expected_exit is None:
                self.retire(worker, code)
                dead.append(worker)
                upcoming = point_kind(self._pending[0]) if self._pending else None
                self.start_worker(slot, arm=upcoming not in self.fired_points)
        return dead

    def signal_worker(self, slot: int, sig: signal.Signals) -> WorkerProcess:
        worker = self.workers[slot]
        worker.expected_exit = "sigkill" if sig == signal.SIGKILL else "sigterm"
        worker.process.send_signal(sig)
        return worker

    def retire(self, worker: WorkerProcess, code: int) -> None:
        """Record how ``worker`` ended. Its armed point fired (its log says so), or the runner
        ended it first: then the point is armed again on the next start, so every scheduled
        kind fires (I6)."""
        self.finished.append((worker, code))
        if not worker.faults:
            return
        kind = point_kind(worker.faults)
        if FAULT_LINE.search(worker.log.read_text(errors="replace")):
            self.fired_points.add(kind)
            if self.window_over:
                self._pending = [p for p in self._pending if point_kind(p) != kind]
        elif not self.window_over:
            self._pending.insert(0, worker.faults)
        elif kind not in self.fired_points | self._armed_kinds():
            self._pending.insert(0, f"{kind}@1")

    def _armed_kinds(self) -> set[str]:
        """Kill-point kinds queued or held by a live worker."""
        live = [w.faults for w in self.workers.values() if w.process.poll() is None]
        return {point_kind(p) for p in [*self._pending, *live] if p}

    def end_window(self) -> list[int]:
        """The fault window is over: the rest of the schedule's points are dropped and each
        kind that never fired is queued as ``kind@1``. Returns the live slots to restart so
        those get armed (one per kind, workers holding a never-fired kind first: a slow
        worker may never reach its N). Bounded: at most one restart per slot here; after
        that only a fired point restarts a worker, and it takes the next queued kind."""
        self.window_over = True
        kinds = dict.fromkeys(map(point_kind, self.kill_points))
        unfired = [k for k in kinds if k not in self.fired_points]
        self._pending = [f"{k}@1" for k in unfired]
        live = [w for w in self.workers.values() if w.process.poll() is None]
        live.sort(key=lambda w: point_kind(w.faults) not in unfired)
        return [w.slot for w in live[:len(unfired)]]

    def alive(self) -> int:
        return sum(1 for w in self.workers.values() if w.process.poll() is None)

    def stop_all(self, timeout: float = 30) -> dict[str, int]:
        """SIGTERM everything; returns exit codes by name (0 = clean stop)."""
        processes = {f"worker-{w.slot}-{w.incarnation}": w.process
                     for w in self.workers.values()}
        if self.relay is not None:
            processes["relay"] = self.relay
        for worker in self.workers.values():
            worker.expected_exit = "sigterm"
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = {}
        deadline = time.monotonic() + timeout
        for name, process in processes.items():
            try:
                codes[name] = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                codes[name] = process.wait()
        for worker in self.workers.values():
            self.finished.append((worker, worker.process.returncode))
        return codes

    def kill_everything(self) -> None:
        for worker in self.workers.values():
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()
        if self.relay is not None and self.relay.poll() is None:
            self.relay.kill()
            self.relay.wait()


@dataclass
class LogStats:
    fault_points: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    phase_errors: Counter[str] = field(default_factory=Counter)  # by exception type


def read_logs(log_dir: Path) -> LogStats:
    """Count what the workers logged: fault points that fired, phase outcomes, events."""
    stats = LogStats()
    counted = {"duplicate", "duplicate_successor_leased", "quarantined", "database_unavailable",
               "emit_failed_relay_will_send",
               "settle_failed", "heartbeat_failed", "heartbeat_partial", "receive_failed",
               "transition_crashed", "side_task_died", "phase_error", "relayed",
               "relay_round_failed", "run_halted"}
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            match = FAULT_LINE.search(line)
            if match:
                stats.fault_points[match.group(1)] += 1
                continue
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            event = record.get("event")
            if event == "phase":
                stats.outcomes[record.get("outcome", "?")] += 1
            elif event in counted:
                stats.events[event] += 1
                if event == "phase_error":
                    stats.phase_errors[str(record.get("error_type"))] += 1
    return stats
