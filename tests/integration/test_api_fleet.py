"""The fleet view through the real ``kubernetes`` client against a local fake apiserver.

No kube-apiserver can run on this machine, so ``FakeApiServer`` serves the two paths the
fleet view reads (a Deployment and a pod list by label selector) over real HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from phasegate.orchestrator.api import Services, create_app
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.fleet import FleetView
from phasegate.presence import PresenceReport, mark_stopped, report
from phasegate.store import create_pool
from phasegate.workflow import Registry
from tests.helpers import queue_for
from tests.json_server import JsonServer

SELECTOR = {"app.kubernetes.io/name": "phasegate", "app.kubernetes.io/component": "worker"}
CONTAINER = {"name": "worker", "image": "phasegate:1"}


def deployment(replicas: int, ready: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "pg-worker", "namespace": "jobs"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": SELECTOR},
                     "template": {"metadata": {"labels": SELECTOR},
                                  "spec": {"containers": [CONTAINER]}}},
            "status": {"replicas": replicas, "readyReplicas": ready, "availableReplicas": ready,
                       "updatedReplicas": replicas}}


def container_status(*, last: dict[str, Any] | None = None,
                     now: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "worker", "image": "phasegate:1", "imageID": "sha256:1", "ready": True,
            "restartCount": 1 if last else 0, "lastState": last or {},
            "state": now or {"running": {"startedAt": "2026-11-29T10:00:00Z"}}}


PODS = {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
    {"metadata": {"name": "pg-worker-a"}, "spec": {"containers": [CONTAINER]},
     "status": {"phase": "Running", "containerStatuses": [container_status(last={"terminated": {
         "reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-11-29T10:05:00Z"}})]}},
    {"metadata": {"name": "pg-worker-b"}, "spec": {"containers": [CONTAINER]},
     "status": {"phase": "Failed", "reason": "Evicted", "startTime": "2026-11-29T09:00:00Z",
                "message": "The node was low on resource: memory."}},
    {"metadata": {"name": "pg-worker-c"}, "spec": {"containers": [CONTAINER]},
     "status": {"phase": "Running", "containerStatuses": [container_status(last={"terminated": {
         "reason": "Completed", "exitCode": 0, "finishedAt": "2026-11-29T10:06:00Z"}})]}},
]}


FORBIDDEN = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
             "code": 403}
NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
             "code": 404}


class FakeApiServer(JsonServer):
    """Serves GET deployments/{name} and pods?labelSelector= for one namespace."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, list[str]], str | None]] = []
        self.deployment = deployment(3, 2)
        self.forbidden = False
        super().__init__(self.respond)

    def respond(self, path: str, headers: Any) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(path)
        self.requests.append((parts.path, parse_qs(parts.query), headers.get("Authorization")))
        if self.forbidden:
            return 403, FORBIDDEN
        if parts.path == "/apis/apps/v1/namespaces/jobs/deployments/pg-worker":
            return 200, self.deployment
        if parts.path == "/api/v1/namespaces/jobs/pods":
            return 200, PODS
        return 404, NOT_FOUND


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


async def test_fleet_snapshot_reads_replicas_and_terminations(apiserver: FakeApiServer) -> None:
    view = FleetView.for_host(apiserver.url, namespace="jobs", deployment="pg-worker",
                              token="t0ken")
    try:
        fleet = await view.snapshot()
    finally:
        view.close()
    assert fleet.in_cluster and fleet.message is None
    assert (fleet.desired_replicas, fleet.ready_replicas, fleet.available_replicas,
            fleet.pods) == (3, 2, 2, 3)
    assert [(t.pod, t.reason, t.exit_code) for t in fleet.terminations] == [
        ("pg-worker-a", "OOMKilled", 137), ("pg-worker-b", "Evicted", None)]
    pods_request = next(r for r in apiserver.requests if r[0].endswith("/pods"))
    assert pods_request[1]["labelSelector"] == [
        "app.kubernetes.io/component=worker,app.kubernetes.io/name=phasegate"]
    assert all(r[2] == "Bearer t0ken" for r in apiserver.requests)


async def test_fleet_errors_are_reported_not_raised(apiserver: FakeApiServer) -> None:
    apiserver.forbidden = True
    view = FleetView.for_host(apiserver.url, namespace="jobs", deployment="pg-worker")
    missing = FleetView.for_host(apiserver.url, namespace="jobs", deployment="nope")
    try:
        fleet = await view.snapshot()
        apiserver.forbidden = False
        gone = await missing.snapshot()
    finally:
        view.close()
        missing.close()
    assert fleet.in_cluster and fleet.message == "cannot read the fleet: HTTP 403 Forbidden"
    assert fleet.desired_replicas is None
    assert gone.message == "cannot read the fleet: HTTP 404 Not Found"


def test_outside_a_cluster_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    view = FleetView.from_environment()
    assert view.api_client is None and "not running in a Kubernetes cluster" in (
        view.reason or "")


async def test_fleet_endpoint_serves_fleet_and_queue(apiserver: FakeApiServer, database_url: str,
                                                     queue_pair: tuple[str, str],
                                                     sqs_endpoint: str) -> None:
    from tests.helpers import make_settings

    settings = make_settings(database_url, queue_pair, sqs_endpoint)
    pool = await create_pool(database_url, min_size=1, max_size=2)
    view = FleetView.for_host(apiserver.url, namespace="jobs", deployment="pg-worker")
    try:
        # Two workers report as a worker does (phasegate/presence.py); one stopped since.
        await report(pool, PresenceReport("w-busy", 120.0, 15.0, 3, 4, "pressure", 2, 30.0))
        await report(pool, PresenceReport("w-idle", 60.0, 15.0, 0, 4, "ok", 0, None))
        await report(pool, PresenceReport("w-gone", 90.0, 15.0, 0, 4, "ok", 0, None))
        await mark_stopped(pool, "w-gone")
        # A pending run whose start message was sent a minute ago; a running one whose
        # successor was sent 20 s ago and has not committed.
        for wid, status, sent_s in (("p-1", "pending", 60), ("r-1", "running", 20)):
            await pool.execute(
                "INSERT INTO workflow_runs (workflow_id, workflow, schema_version, status, "
                "next_seq, current_phase) VALUES ($1, 'chain', 1, $2, 0, 'fetch')",
                wid, status)
            await pool.execute(
                "INSERT INTO outbox (workflow_id, seq, dedup_id, group_id, body, sent_at) "
                "VALUES ($1, 0, $1, $1, '{}', now() - make_interval(secs => $2))",
                wid, float(sent_s))
        async with queue_for(settings) as queue:
            app = create_app(Services(control=Control(pool, queue, Registry()), queue=queue,
                                      fleet=view))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://api") as client:
                body = (await client.get("/v1/fleet")).json()
    finally:
        view.close()
        await pool.close()
    assert body["fleet"]["deployment"] == "pg-worker" and body["fleet"]["ready_replicas"] == 2
    assert [t["reason"] for t in body["fleet"]["terminations"]] == ["OOMKilled", "Evicted"]
    assert body["queue"] == {"visible": 0, "inflight": 0, "delayed": 0, "error": None}
    # The live workers, oldest first, with what the console's fleet page shows and no more.
    workers = body["workers"]
    assert [(w["worker_id"], w["watchdog"], w["in_flight"], w["concurrency"], w["flushes"])
            for w in workers] == [("w-busy", "pressure", 3, 4, 2), ("w-idle", "ok", 0, 4, 0)]
    assert set(workers[0]) == {"worker_id", "watchdog", "in_flight", "concurrency", "flushes",
                               "last_flush_at", "started_at", "last_seen"}
    assert workers[0]["last_flush_at"] is not None and workers[1]["last_flush_at"] is None
    ages = body["ages"]
    assert (ages["not_started"], ages["uncommitted"]) == (1, 1)
    assert ages["not_started_s"] >= 60 and 20 <= ages["uncommitted_s"] < ages["not_started_s"]
