"""Checkpoint-aware scale-in: keep this pod's ``controller.kubernetes.io/pod-deletion-cost``
current, so a ReplicaSet scaling in removes the pods that would lose the least work first.

The cost is the work a kill would throw away: the seconds of uncommitted phase work this worker
holds (0 when idle, so idle pods go first), capped below the annotation's int32 limit. The
worker patches its own pod at most every ``deletion_cost_interval_s`` and only when the value
changed. Kubernetes documents the annotation as best effort, and so is this: a failed patch is
logged (once per kind of failure) and counted, never raised, and never touches a phase.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import structlog
from prometheus_client import Counter, Gauge

from phasegate.settings import Settings

log = structlog.get_logger("phasegate.deletion_cost")

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
# The annotation is an int32 (k8s.io/kubernetes pkg/controller/controller_utils.go).
MAX_COST = 2**31 - 1

COST = Gauge("phasegate_pod_deletion_cost", "The pod-deletion-cost this worker last set.")
PATCHES = Counter("phasegate_pod_deletion_cost_patches_total",
                  "Patches of this pod's deletion cost, by result.", ["result"])
for _result in ("ok", "error"):
    PATCHES.labels(_result)


def deletion_cost(uncommitted_seconds: Iterable[float]) -> int:
    """0 when idle; otherwise 1 + the whole seconds of uncommitted work, capped at int32."""
    seconds = [s for s in uncommitted_seconds if s >= 0]
    if not seconds:
        return 0
    return min(MAX_COST, 1 + math.floor(sum(seconds)))


class PodPatcher(Protocol):
    def __call__(self, name: str, namespace: str, body: dict[str, Any]) -> None: ...


def kubernetes_patcher(host: str | None = None, token: str | None = None) -> PodPatcher:
    """A patcher on the official client: in-cluster config, or an explicit API server."""
    from kubernetes import client, config

    if host is None:
        config.load_incluster_config()
        api = client.CoreV1Api()
    else:
        configuration = client.Configuration()
        configuration.host = host
        if token:
            configuration.api_key = {"authorization": f"Bearer {token}"}
        api = client.CoreV1Api(client.ApiClient(configuration))

    def patch(name: str, namespace: str, body: dict[str, Any]) -> None:
        api.patch_namespaced_pod(name, namespace, body)

    return patch


class DeletionCostUpdater:
    """Side task of the worker: ``run()`` until ``stop()``; it never raises."""

    def __init__(self, *, pod_name: str, namespace: str, interval_s: float,
                 uncommitted: Callable[[], Iterable[float]], patcher: PodPatcher,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pod_name = pod_name
        self.namespace = namespace
        self.interval_s = interval_s
        self._uncommitted = uncommitted
        self._patcher = patcher
        self._clock = clock
        self._stop = asyncio.Event()
        self.last_cost: int | None = None
        self._reported: set[str] = set()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            await self.update_once()
            try:
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
            except TimeoutError:
                continue

    async def update_once(self) -> bool:
        """Patch when the cost changed; True when a patch was sent and accepted."""
        try:
            cost = deletion_cost(self._uncommitted())
        except Exception as exc:  # a bug here must not stop the worker either
            self._failed("cost", exc)
            return False
        if cost == self.last_cost:
            return False
        body = {"metadata": {"annotations": {ANNOTATION: str(cost)}}}
        try:
            await asyncio.to_thread(self._patcher, self.pod_name, self.namespace, body)
        except Exception as exc:
            self._failed("patch", exc)
            return False
        self.last_cost = cost
        COST.set(cost)
        PATCHES.labels("ok").inc()
        return True

    def _failed(self, stage: str, exc: Exception) -> None:
        PATCHES.labels("error").inc()
        kind = f"{stage}:{type(exc).__name__}:{getattr(exc, 'status', '')}"
        if kind in self._reported:
            return
        self._reported.add(kind)
        log.warning("deletion_cost_failed", stage=stage, pod=self.pod_name,
                    error=f"{type(exc).__name__}: {exc}"[:300])


def updater_from_settings(settings: Settings, running: Callable[[], Iterable[float]],
                          patcher: PodPatcher | None = None) -> DeletionCostUpdater | None:
    """The updater the settings ask for, or None (off, outside a pod, or no API access)."""
    if not settings.deletion_cost:
        return None
    if not settings.pod_name or not settings.pod_namespace:
        log.warning("deletion_cost_off", reason="PHASEGATE_POD_NAME / PHASEGATE_POD_NAMESPACE "
                    "are not set (the chart sets them from the downward API)")
        return None
    if patcher is None:
        try:
            patcher = kubernetes_patcher()
        except Exception as exc:
            log.warning("deletion_cost_off", reason=f"no Kubernetes API access: "
                        f"{type(exc).__name__}: {exc}"[:300])
            return None
    return DeletionCostUpdater(pod_name=settings.pod_name, namespace=settings.pod_namespace,
                               interval_s=settings.deletion_cost_interval_s,
                               uncommitted=running, patcher=patcher)
