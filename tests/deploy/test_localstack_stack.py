"""The local stack: the LocalStack ready hook creates the FIFO queue pair (run here for real
against an SQS server over HTTP), and the compose file wires the parts the way the chart does."""

from __future__ import annotations

import json
import runpy
import subprocess

import boto3
import pytest
import yaml

from phasegate.orchestrator.embedded import EmbeddedSqs
from tests.deploy import chart

LOCALSTACK = chart.ROOT / "localstack"
HOOK = LOCALSTACK / "init" / "ready.d" / "10-create-queues.py"


@pytest.fixture
def sqs_server(monkeypatch):
    with EmbeddedSqs() as server:
        monkeypatch.setenv("GATEWAY_LISTEN", f"127.0.0.1:{server.port}")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("PHASEGATE_VISIBILITY_TIMEOUT_S", "45")
        yield server


def test_ready_hook_creates_fifo_queue_and_dlq_with_redrive(sqs_server, capsys):
    runpy.run_path(str(HOOK))
    runpy.run_path(str(HOOK))  # LocalStack may run hooks again on restart: idempotent
    assert "phasegate queues ready" in capsys.readouterr().out

    sqs = boto3.client("sqs", endpoint_url=sqs_server.endpoint_url, region_name="us-east-1",
                       aws_access_key_id="test", aws_secret_access_key="test")
    # moto keeps one backend per process: other tests' queues are visible here too.
    urls = sorted(sqs.list_queues(QueueNamePrefix="phasegate")["QueueUrls"])
    assert [u.rsplit("/", 1)[-1] for u in urls] == ["phasegate-dlq.fifo", "phasegate.fifo"]
    attrs = {u.rsplit("/", 1)[-1]: sqs.get_queue_attributes(
        QueueUrl=u, AttributeNames=["All"])["Attributes"] for u in urls}
    queue, dlq = attrs["phasegate.fifo"], attrs["phasegate-dlq.fifo"]
    assert queue["FifoQueue"] == dlq["FifoQueue"] == "true"
    # High-throughput FIFO: dedup and the throughput quota per message group (one per run).
    for attributes in (queue, dlq):
        assert attributes["DeduplicationScope"] == "messageGroup"
        assert attributes["FifoThroughputLimit"] == "perMessageGroupId"
    assert queue["VisibilityTimeout"] == "45"  # matches the worker's setting
    redrive = json.loads(queue["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq["QueueArn"]
    assert int(redrive["maxReceiveCount"]) == 50


def test_compose_stack_runs_every_part_from_one_image():
    compose = yaml.safe_load((LOCALSTACK / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) >= {"localstack", "postgres", "migrate", "worker", "orchestrator"}
    mounts = services["localstack"]["volumes"]
    assert "./init/ready.d:/etc/localstack/init/ready.d:ro" in mounts
    assert services["localstack"]["environment"]["SERVICES"] == "sqs"
    for name, command in (("migrate", "migrate"), ("worker", "worker"),
                          ("orchestrator", "orchestrator")):
        assert services[name]["command"] == [command]
        env = services[name]["environment"]
        assert env["PHASEGATE_QUEUE_URL"].endswith("/phasegate.fifo")
        assert env["PHASEGATE_SQS_ENDPOINT_URL"] == "http://localstack:4566"
    assert services["migrate"]["build"]["dockerfile"] == "Dockerfile"
    for name in ("worker", "orchestrator"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully")
    assert services["orchestrator"]["environment"]["PHASEGATE_API_HOST"] == "0.0.0.0"
    # It runs the shipped sample workflow unless told otherwise, and says how to start one.
    modules = services["worker"]["environment"]["PHASEGATE_WORKFLOW_MODULES"]
    assert modules == "${PHASEGATE_WORKFLOW_MODULES:-worker.samples}"
    from phasegate.samples import pipeline

    text = (LOCALSTACK / "compose.yaml").read_text()
    assert f"phasegate start {pipeline.name}" in text
    # Same stop contract as the chart: the drain fits inside the stop grace.
    grace = int(services["worker"]["stop_grace_period"].removesuffix("s"))
    values = chart.load_values(chart.CHART_DIR / "values.yaml")
    assert grace == values["worker"]["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("script", ["localstack/run-without-docker.sh",
                                    "scripts/localstack-e2e.sh"])
def test_scripts_parse_and_pin_localstack(script):
    path = chart.ROOT / script
    assert path.stat().st_mode & 0o111, f"{script} is not executable"
    subprocess.run(["bash", "-n", str(path)], check=True)
    text = path.read_text()
    if script.endswith("run-without-docker.sh"):
        for pin in ("localstack-core[runtime]==4.13.1", "cbor2<6", "pyopenssl<26",
                    "cryptography>=45.0.7,<47", "service-identity"):
            assert f'"{pin}"' in text
        for env in ("OVERRIDE_IN_DOCKER=0", "SERVICES=sqs", "EAGER_SERVICE_LOADING=1",
                    "SQS_ENDPOINT_STRATEGY=path", "FILESYSTEM_ROOT="):
            assert f"export {env}" in text
    else:
        assert "trap stop_localstack EXIT" in text
        assert "PHASEGATE_TEST_SQS_ENDPOINT_URL" in text
