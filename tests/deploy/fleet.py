"""A queue-driven worker fleet in discrete one-second steps, driven by the HPA model.

What it models, and why it matters for scale to zero:
- a FIFO queue: messages are visible until a worker receives them, then in flight until the
  phase finishes and the worker deletes them;
- workers hold up to `concurrency` messages; a new pod receives only after its cold start;
- the exporter publishes visible and in-flight counts; Prometheus scrapes them every
  `scrape_s`, so the HPA acts on a value up to that old;
- the HPA syncs every `sync_s` (kube-controller-manager's default period is 15 s);
- scale-in sends SIGTERM to the pods the ReplicaSet removes (not-ready first, then newest):
  they stop receiving, finish what they can within the shutdown grace, and hand the rest
  back (visible again, the phase redone). Their messages stay in flight while they drain.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.deploy.hpa import HorizontalPodAutoscaler

HPA_SYNC_S = 15  # --horizontal-pod-autoscaler-sync-period default


@dataclass
class Pod:
    started: int
    ready_at: int
    jobs: list[int] = field(default_factory=list)  # seconds of work left per message
    stopping_since: int | None = None


@dataclass
class Sample:
    t: int
    replicas: int
    visible: int
    inflight: int
    observed: float  # what the HPA saw at its last sync
    completed: int
    handed_back: int


@dataclass
class Fleet:
    hpa: HorizontalPodAutoscaler
    concurrency: int
    shutdown_grace_s: float
    cold_start_s: int = 20
    redo_s: int = 60  # how long a handed-back phase takes when it is run again
    scrape_s: int = 30
    sync_s: int = HPA_SYNC_S
    replicas: int = 0
    pods: list[Pod] = field(default_factory=list)
    visible: deque[int] = field(default_factory=deque)
    completed: int = 0
    arrived: int = 0
    handed_back: int = 0
    scraped: float = 0.0
    observed: float = 0.0
    history: list[Sample] = field(default_factory=list)

    def inflight(self) -> int:
        return sum(len(p.jobs) for p in self.pods)

    def run(self, seconds: int, arrivals: Callable[[int], list[int]], start: int = 0) -> None:
        """Advance `seconds`; `arrivals(t)` returns the work durations of messages sent at t."""
        for t in range(start, start + seconds):
            for duration in arrivals(t):
                self.visible.append(duration)
                self.arrived += 1
            self._work(t)
            if t % self.scrape_s == 0:
                self.scraped = len(self.visible) + self.inflight()
            if t % self.sync_s == 0:
                self.observed = self.scraped
                self._scale(t, self.hpa.reconcile(t, self.replicas, self.replicas, self.scraped))
            self.history.append(Sample(t, self.replicas, len(self.visible), self.inflight(),
                                       self.observed, self.completed, self.handed_back))
            assert self.completed + len(self.visible) + self.inflight() == self.arrived

    def _work(self, t: int) -> None:
        for pod in list(self.pods):
            finished = [j for j in pod.jobs if j <= 1]
            pod.jobs = [j - 1 for j in pod.jobs if j > 1]
            self.completed += len(finished)
            if pod.stopping_since is not None:
                if not pod.jobs:
                    self.pods.remove(pod)
                elif t - pod.stopping_since >= self.shutdown_grace_s:
                    # Grace is over: hand the rest back with visibility 0; the phase is redone.
                    self.handed_back += len(pod.jobs)
                    self.visible.extend(self.redo_s for _ in pod.jobs)
                    self.pods.remove(pod)
                continue
            if t >= pod.ready_at:
                while self.visible and len(pod.jobs) < self.concurrency:
                    pod.jobs.append(self.visible.popleft())

    def _scale(self, t: int, desired: int) -> None:
        self.replicas = desired
        running = [p for p in self.pods if p.stopping_since is None]
        while len(running) < desired:
            pod = Pod(started=t, ready_at=t + self.cold_start_s)
            self.pods.append(pod)
            running.append(pod)
        if len(running) > desired:
            # ReplicaSet victim order: not ready before ready, then the newest first.
            victims = sorted(running, key=lambda p: (p.ready_at <= t, -p.started))
            for pod in victims[: len(running) - desired]:
                pod.stopping_since = t
