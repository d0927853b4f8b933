"""The seeded fault schedule: everything the chaos run will do to the system, decided up front.

``build_schedule(seed, ...)`` is a pure function of its arguments, so the seed printed on a
failure reproduces the same schedule (which worker dies at which fault point, when Postgres
restarts, when the SQS proxy throttles, which poison is sent when). What happens in between
is timing-dependent by nature; the schedule is what the seed fixes.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

# Kill points inside the worker (phasegate/faults.py): each worker incarnation is armed with one
# of these as ``point@N`` and restarted after it fires.
# ``mid_chain``: with local continuation on (the default) a worker also dies between a
# continued phase's commit (the next phase held by its chain lease) and the next phase; a fleet
# run with continuation off never reaches that point, so its schedule leaves it out.
KILL_POINTS = ("after_receive", "step_claimed", "step_effect", "mid_phase", "after_commit",
               "after_send", "mid_chain")


def kill_points(continuation: bool = True) -> tuple[str, ...]:
    """The kill points a fleet with (or without) local continuation can reach."""
    return KILL_POINTS if continuation else tuple(p for p in KILL_POINTS if p != "mid_chain")

# SQS faults the proxy injects during a window (bench/chaos/sqs_proxy.py).
SQS_FAULTS = ("throttle", "server_error", "slow", "send_response_dropped", "send_lost",
              "outage")

# Poison kinds the runner sends (bench/chaos/poison.py); each must end up quarantined.
POISON_KINDS = ("not_json", "invalid_envelope", "bad_workflow_id", "extra_field",
                "unknown_workflow", "unknown_phase", "oversized", "no_run", "seq_ahead",
                "workflow_mismatch")


@dataclass(frozen=True)
class Event:
    """One timed action, ``at_s`` seconds after the fault phase starts."""

    at_s: float
    kind: str
    detail: dict[str, object] = field(default_factory=dict)


@dataclass
class Schedule:
    seed: int
    workflows: int
    workers: int
    fault_window_s: float
    kill_points: list[str]
    events: list[Event]
    sqs_fault_probability: dict[str, float]
    pg_commit_cut_probability: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def describe(self) -> str:
        lines = [f"seed {self.seed}: {self.workflows} workflows, {self.workers} workers, "
                 f"faults for {self.fault_window_s:.0f}s",
                 f"  worker kill points (in turn, point@N): {', '.join(self.kill_points)}",
                 f"  SQS fault probability inside windows: {self.sqs_fault_probability}",
                 f"  commit-result cut probability: {self.pg_commit_cut_probability}"]
        lines += [f"  t={e.at_s:6.1f}s {e.kind} {e.detail or ''}" for e in self.events]
        return "\n".join(lines)


def build_schedule(seed: int, *, workflows: int, workers: int, long: bool = False,
                   continuation: bool = True) -> Schedule:
    rng = random.Random(seed)
    # The long run produces its workflows over 80% of a 900 s window (about 2.8 a second for
    # 2,000): a pace the fleet keeps up with on two cores, so faults land on a busy system
    # instead of on a backlog.
    window = 900.0 if long else 40.0
    events: list[Event] = []

    def spread(kind: str, times: int, start: float = 2.0, **detail: object) -> None:
        slot = (window - start) / times
        for i in range(times):
            events.append(Event(round(start + slot * i + rng.uniform(0, slot * 0.8), 2), kind,
                                dict(detail)))

    scale = 5 if long else 1
    spread("sigkill_worker", 3 * scale, start=4.0)
    spread("sigterm_worker", 2 * scale, start=6.0)
    spread("sigkill_relay", 1 * scale, start=12.0)
    spread("pg_restart", 2 * scale, start=8.0)
    spread("duplicates", 4 * scale, start=3.0, count=6)
    spread("poison", 2 * scale, start=3.0)
    spread("downstream_lose_next", 2 * scale, start=5.0)
    # SQS fault windows: each kind gets windows of a few seconds where the proxy injects it.
    # Outages come first; the other windows avoid them (an outage would hide them, and I6
    # would then count a fault that never reached anyone).
    outages: list[tuple[float, float]] = []
    for kind in sorted(SQS_FAULTS, key=lambda k: k != "outage"):
        for _ in range(1 * scale if kind == "outage" else 2 * scale):
            duration = rng.uniform(12.0, 18.0) if kind == "outage" else rng.uniform(2.0, 5.0)
            latest = window - (20.0 if kind == "outage" else 6.0)
            start = round(rng.uniform(3.0, latest), 2)
            for _attempt in range(100):
                if not any(a - duration < start < b for a, b in outages):
                    break
                start = round(rng.uniform(3.0, latest), 2)
            if kind == "outage":
                outages.append((start, start + duration))
            events.append(Event(start, "sqs_window",
                                {"fault": kind, "duration_s": round(duration, 2)}))
    # A flaky path to the database: for a few seconds most answers to commits and step
    # records are lost after the server committed them.
    spread("pg_flaky", 1 * scale, start=14.0, duration_s=10.0, probability=0.6)
    # Commit cuts are probabilistic per commit statement, but at least one is forced early.
    events.append(Event(round(rng.uniform(3.0, 10.0), 2), "pg_cut_next_commit", {}))
    events.sort(key=lambda e: (e.at_s, e.kind))
    points = list(kill_points(continuation))
    rng.shuffle(points)
    armed = [f"{points[i % len(points)]}@{rng.randint(3, 25)}"
             for i in range(len(points) * 2 * scale)]
    return Schedule(seed=seed, workflows=workflows, workers=workers, fault_window_s=window,
                    kill_points=armed, events=events,
                    # High enough that botocore's own retries (5 attempts) sometimes give up
                    # and the engine sees the error.
                    sqs_fault_probability={"throttle": 0.85, "server_error": 0.8,
                                           "slow": 0.6, "send_response_dropped": 0.7,
                                           "send_lost": 0.3,
                                           "outage": 1.0},
                    pg_commit_cut_probability=0.02)
