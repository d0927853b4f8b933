"""The fleet view: the worker Deployment's desired/ready replicas and recent pod terminations
(OOMKilled, Evicted, ...), read with the ``kubernetes`` client.

Two API calls: ``GET /apis/apps/v1/namespaces/{ns}/deployments/{name}`` and
``GET /api/v1/namespaces/{ns}/pods?labelSelector=...`` (the Deployment's own selector). The
orchestrator's service account needs ``get`` on deployments and ``list`` on pods. Outside a
cluster the view says so instead of failing.
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel

log = structlog.get_logger("phasegate.fleet")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_DEPLOYMENT = "phasegate-worker"
MAX_TERMINATIONS = 20
API_TIMEOUT_S = 5.0


class Termination(BaseModel):
    pod: str
    container: str | None
    reason: str
    exit_code: int | None
    finished_at: datetime | None


class Fleet(BaseModel):
    in_cluster: bool
    message: str | None = None
    namespace: str | None = None
    deployment: str | None = None
    desired_replicas: int | None = None
    ready_replicas: int | None = None
    available_replicas: int | None = None
    updated_replicas: int | None = None
    pods: int | None = None
    terminations: list[Termination] = []


class FleetView:
    """Reads the fleet through a ``kubernetes.client.ApiClient``; None means not in a cluster."""

    def __init__(self, api_client: Any | None, *, namespace: str | None = None,
                 deployment: str = DEFAULT_DEPLOYMENT, reason: str | None = None) -> None:
        self.api_client = api_client
        self.namespace = namespace or "default"
        self.deployment = deployment
        self.reason = reason

    @classmethod
    def from_environment(cls, *, deployment: str | None = None,
                         namespace: str | None = None) -> FleetView:
        """In-cluster config when running in a pod; otherwise a view that says so."""
        deployment = deployment or DEFAULT_DEPLOYMENT
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls(None, deployment=deployment, namespace=namespace,
                       reason="not running in a Kubernetes cluster (KUBERNETES_SERVICE_HOST "
                              "is unset): no fleet view")
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException as exc:
            return cls(None, deployment=deployment, namespace=namespace,
                       reason=f"in-cluster Kubernetes config unusable: {exc}")
        if namespace is None and SERVICE_ACCOUNT_NAMESPACE.exists():
            namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        return cls(client.ApiClient(), namespace=namespace, deployment=deployment)

    @classmethod
    def for_host(cls, host: str, *, namespace: str, deployment: str,
                 token: str | None = None) -> FleetView:
        """An explicit API server (tests point this at a local fake apiserver)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = host
        if token:
            configuration.api_key = {"authorization": f"Bearer {token}"}
        return cls(client.ApiClient(configuration), namespace=namespace, deployment=deployment)

    async def snapshot(self) -> Fleet:
        if self.api_client is None:
            return Fleet(in_cluster=False, message=self.reason)
        try:
            return await asyncio.to_thread(self._read)
        except Exception as exc:
            log.warning("fleet_read_failed", error=f"{type(exc).__name__}: {exc}"[:300])
            return Fleet(in_cluster=True, namespace=self.namespace, deployment=self.deployment,
                         message=f"cannot read the fleet: {_describe(exc)}")

    def close(self) -> None:
        if self.api_client is not None:
            self.api_client.close()

    def _read(self) -> Fleet:
        from kubernetes import client

        apps = client.AppsV1Api(self.api_client)
        core = client.CoreV1Api(self.api_client)
        deployment = apps.read_namespaced_deployment(
            self.deployment, self.namespace, _request_timeout=API_TIMEOUT_S)
        labels = (deployment.spec.selector.match_labels or {}) if deployment.spec else {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        pods = core.list_namespaced_pod(self.namespace, label_selector=selector,
                                        _request_timeout=API_TIMEOUT_S).items
        status = deployment.status
        return Fleet(
            in_cluster=True, namespace=self.namespace, deployment=self.deployment,
            desired_replicas=deployment.spec.replicas if deployment.spec else None,
            ready_replicas=(status.ready_replicas or 0) if status else None,
            available_replicas=(status.available_replicas or 0) if status else None,
            updated_replicas=(status.updated_replicas or 0) if status else None,
            pods=len(pods), terminations=recent_terminations(pods))


def recent_terminations(pods: list[Any], limit: int = MAX_TERMINATIONS) -> list[Termination]:
    """Evicted pods and containers whose current or last state is terminated abnormally."""
    found: list[Termination] = []
    for pod in pods:
        name = pod.metadata.name if pod.metadata else "?"
        status = pod.status
        if status is None:
            continue
        if status.reason == "Evicted":
            found.append(Termination(pod=name, container=None, reason="Evicted", exit_code=None,
                                     finished_at=status.start_time))
        for container in status.container_statuses or []:
            for state in (container.state, container.last_state):
                terminated = state.terminated if state else None
                if terminated is None or terminated.reason == "Completed":
                    continue
                found.append(Termination(
                    pod=name, container=container.name, reason=terminated.reason or "Error",
                    exit_code=terminated.exit_code, finished_at=terminated.finished_at))
    found.sort(key=lambda t: t.finished_at.timestamp() if t.finished_at else 0.0, reverse=True)
    return found[:limit]


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"[:200]
