"""The built image, run as the chart's pod specs run it, against a real PostgreSQL and a real
SQS server over HTTP (moto; containers share the host network).

Each container gets exactly what the rendered chart gives the pod: uid/gid, read-only root
filesystem with a size-limited tmpfs at /tmp, all capabilities dropped, no-new-privileges,
the chart's environment and args, the memory limit, and ``docker stop`` with the pod's
terminationGracePeriodSeconds. The test adds only what the cluster would: AWS credentials
(IRSA on EKS) and, for the memory test, the user's workflow module on a read-only mount.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from phasegate.envelope import canonical_json, start_message, state_hash
from phasegate.orchestrator.embedded import local_aws_env
from phasegate.settings import Settings
from tests.deploy import chart
from tests.helpers import all_done, fetch, fetchval, send_raw, wait_for
from tests.image.conftest import free_port
from tests.image.containers import Container
from tests.image.podspec import PodRun, pod_run

RUNS = 20
FLOWS_DIR = Path(__file__).resolve().parent


def chart_values(database_url: str, queue_pair: tuple[str, str], endpoint: str,
                 **worker: Any) -> dict[str, Any]:
    """The default scenario pointed at the test's servers, on free host ports."""
    values = chart.load_values(chart.SCENARIO_DIR / "default-values.yaml")
    return chart.merge_values(values, {
        "config": {"queueUrl": queue_pair[0], "dlqUrl": queue_pair[1], "awsRegion": "us-east-1",
                   "sqsEndpointUrl": endpoint, "workflowModules": "phasegate.samples,imageflows"},
        "database": {"url": database_url},
        "worker": {"metricsPort": free_port(), "visibilityTimeoutSeconds": 10,
                   "heartbeatSeconds": 3, **worker},
        "orchestrator": {"port": free_port()},
    })


def runs_of(values: dict[str, Any]) -> dict[str, PodRun]:
    rendered = chart.render(values)
    return {"migrate": pod_run(rendered, "Job", "-migrate", "pg-migrate-x1"),
            "orchestrator": pod_run(rendered, "Deployment", "-orchestrator", "pg-orch-x1"),
            "worker": pod_run(rendered, "Deployment", "-worker", "pg-worker-x1")}


# What the cluster adds: IRSA's credentials, and where the user's workflow module is mounted.
CLUSTER_ENV = {**local_aws_env(), "PYTHONPATH": "/opt/flows"}
FLOWS_MOUNT = ["--volume", f"{FLOWS_DIR / 'imageflows.py'}:/opt/flows/imageflows.py:ro"]


def start(run: PodRun, image: str, prefix: str, **kwargs: Any) -> Container:
    return Container.start(run.docker_args(image, env={**CLUSTER_ENV, **kwargs.pop("env", {})},
                                           extra=FLOWS_MOUNT, **kwargs), prefix)


def http(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, None
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:  # /readyz answers plain text
        return status, raw.decode()


async def answers(url: str) -> bool:
    status, _ = await asyncio.to_thread(http, "GET", url)
    return status == 200


def test_pod_spec_maps_to_the_restricted_docker_flags(empty_database_url, queue_pair,
                                                     sqs_endpoint):
    runs = runs_of(chart_values(empty_database_url, queue_pair, sqs_endpoint))
    for name, run in runs.items():
        flags = " ".join(run.flags)
        assert "--user 10001:10001" in flags, name
        assert "--read-only" in flags and "--cap-drop ALL" in flags, name
        assert "--security-opt no-new-privileges" in flags, name
        assert "--tmpfs /tmp:size=" in flags, name
        assert run.env["PHASEGATE_DATABASE_URL"] == empty_database_url, name
    assert runs["worker"].args == ["worker"] and runs["migrate"].args == ["migrate"]
    assert runs["worker"].grace_seconds == 45
    assert runs["worker"].memory_limit == 1 << 30


def test_migrate_orchestrator_and_worker_run_the_sample_workflow(
        image, empty_database_url, queue_pair, sqs_endpoint, record_property):
    runs = runs_of(chart_values(empty_database_url, queue_pair, sqs_endpoint))
    containers: list[Container] = []
    try:
        migrate = start(runs["migrate"], image, "pg-migrate")
        containers.append(migrate)
        assert migrate.wait(timeout=120) == 0, migrate.logs()
        tables = asyncio.run(fetchval(empty_database_url,
                                      "SELECT count(*) FROM information_schema.tables "
                                      "WHERE table_name IN ('workflow_runs', 'checkpoints')"))
        assert tables == 2

        orchestrator = start(runs["orchestrator"], image, "pg-orch")
        worker = start(runs["worker"], image, "pg-worker")
        containers += [orchestrator, worker]
        api = f"http://127.0.0.1:{runs['orchestrator'].env['PHASEGATE_API_PORT']}"
        metrics = f"http://127.0.0.1:{runs['worker'].env['PHASEGATE_METRICS_PORT']}"
        asyncio.run(wait_for(lambda: answers(f"{api}/readyz"), timeout=90,
                             interval=0.5, what="orchestrator /readyz"))
        asyncio.run(wait_for(lambda: answers(f"{metrics}/readyz"), timeout=90,
                             interval=0.5, what="worker /readyz"))

        ids = [f"img-{uuid.uuid4().hex[:12]}" for _ in range(RUNS)]
        for workflow_id in ids:
            status, body = http("POST", f"{api}/v1/workflows",
                                {"workflow": "document-pipeline", "id": workflow_id,
                                 "input": {"pages": 2}})
            assert status == 201, body
        asyncio.run(wait_for(lambda: all_done(empty_database_url, ids), timeout=180,
                             interval=0.5, what=f"{RUNS} runs completed"))
        status, body = http("GET", f"{api}/v1/workflows/{ids[0]}")
        assert status == 200 and body["status"] == "completed", body

        for name, container, run in (("worker", worker, runs["worker"]),
                                     ("orchestrator", orchestrator, runs["orchestrator"])):
            code, took = container.stop(run.grace_seconds)
            assert code == 0, f"{name} exited {code} on docker stop:\n{container.logs()[-3000:]}"
            record_property(f"{name}_stop_seconds", round(took, 2))
            print(f"{name}: docker stop -> exit 0 in {took:.1f}s "
                  f"(grace {run.grace_seconds}s)")
            assert not container.state()["OOMKilled"]
    finally:
        for container in containers:
            container.remove()


def test_memory_limited_worker_flushes_on_headroom_before_the_oom_kill_and_a_second_resumes(
        image, settings: Settings, database_url, queue_pair, sqs_endpoint, record_property):
    limit = 256 << 20
    runs = runs_of(chart_values(database_url, queue_pair, sqs_endpoint))
    workflow_id = f"heap-{uuid.uuid4().hex[:12]}"
    containers: list[Container] = []
    try:
        first = start(runs["worker"], image, "pg-heap1", memory=limit)
        containers.append(first)
        asyncio.run(send_raw(settings, start_message(workflow_id, "heap",
                                                     {"target_mb": 400}).to_json(),
                             group=workflow_id))
        code = first.wait(timeout=180)
        state = first.state()
        events = first.events()
        assert state["OOMKilled"] and code == 137, (code, first.logs()[-3000:])
        names = [e.get("event") for e in events]
        assert "watchdog_headroom_only" in names, names[:20]
        flushes = [e for e in events if e.get("event") == "emergency_flush"]
        assert flushes, f"no emergency flush before the kill: {names[-20:]}"
        rows = asyncio.run(fetch(database_url,
                                 "SELECT state::text FROM checkpoints WHERE workflow_id = $1 "
                                 "AND kind = 'emergency' ORDER BY created_at", workflow_id))
        assert rows, "the flush persisted an emergency checkpoint"
        # The emergency checkpoint's state is the phase's last ctx.progress value.
        flushed_mb = max(int(json.loads(r["state"])["mb"]) for r in rows)
        assert flushed_mb > 0
        record_property("flushed_mb", flushed_mb)

        # A second worker (the pod's own 1Gi limit) picks the message up once its visibility
        # lapses and continues from the flushed progress.
        second = start(runs["worker"], image, "pg-heap2",
                       env={"PHASEGATE_METRICS_PORT": str(free_port())})
        containers.append(second)
        asyncio.run(wait_for(lambda: all_done(database_url, [workflow_id]), timeout=120,
                             interval=0.5, what="the run resumed and completed"))
        final = asyncio.run(fetch(database_url,
                                  "SELECT state::text FROM checkpoints WHERE workflow_id = $1 "
                                  "AND kind = 'phase' AND phase = 'grow'", workflow_id))
        resumed_from = json.loads(final[0]["state"])["resumed_from_mb"]
        record_property("resumed_from_mb", resumed_from)
        print(f"OOM-killed at 256 MiB after an emergency flush; resumed from {resumed_from} MiB")
        assert resumed_from > 0, "the second worker continued from the flushed progress"
        code, _ = second.stop(runs["worker"].grace_seconds)
        assert code == 0
    finally:
        for container in containers:
            container.remove()


async def seed_runs_for_the_gate(dsn: str) -> None:
    """Unfinished runs as an older release left them: 3 at their input (any code resumes
    them) and 2 of "heap" after a checkpoint of schema version 2, newer than the image's
    heap (version 1: a rollback, no downcasters), so those 2 would stop at needs_restart."""
    state = canonical_json({"k": 1})
    for i in range(5):
        at_input = i < 3
        wid = f"gate-{i}-{uuid.uuid4().hex[:6]}"
        await fetch(dsn, "INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, "
                    "current_phase, schema_version) VALUES ($1, 'heap', 'running', $2, "
                    "'grow', 1)", wid, 0 if at_input else 1)
        if not at_input:
            await fetch(dsn, "INSERT INTO checkpoints (workflow_id, seq, phase, kind, "
                        "schema_version, state, state_hash) VALUES ($1, 0, 'grow', 'phase', "
                        "2, $2::jsonb, $3)", wid, state, state_hash(state))


def test_pre_upgrade_gate_job_refuses_when_too_many_runs_need_a_restart(
        image, database_url, queue_pair, sqs_endpoint):
    asyncio.run(seed_runs_for_the_gate(database_url))
    outcomes = {}
    for share in (0.25, 0.5):
        values = chart.merge_values(chart_values(database_url, queue_pair, sqs_endpoint),
                                    {"upgradeGate": {"maxRestartShare": share}})
        run = pod_run(chart.render(values, is_upgrade=True), "Job", "-upgrade-gate",
                      "pg-upgrade-gate-x1")
        assert run.args == ["versions", "--max-restart-share", str(share)]
        gate = start(run, image, "pg-gate")
        try:
            outcomes[share] = (gate.wait(timeout=120), gate.logs())
        finally:
            gate.remove()
    code, output = outcomes[0.25]
    assert code == 1, output
    assert "upgrade refused: 2 of 5 unfinished runs (40.0%) would need a restart" in output
    assert "heap (2 of 5)" in output
    code, output = outcomes[0.5]
    assert code == 0, output
    assert "upgrade allowed" in output
