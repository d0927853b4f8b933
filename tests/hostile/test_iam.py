"""The IAM policies in docs/how-to/deploy-eks.md are what the worker, the relay and the
orchestrator call: each runs
as a real process against moto server with IAM enforced (INITIAL_NO_AUTH_ACTION_COUNT), as an
IAM user holding exactly the documented policy. A call the policy does not grant is
AccessDenied, and the process would fail to start or log it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aioboto3
import httpx
import pytest
from botocore.exceptions import ClientError

from phasegate.envelope import start_message
from phasegate.orchestrator.embedded import free_port
from phasegate.queue import create_fifo_queue_pair
from tests.helpers import ROOT, all_done, fetchval, make_settings, settings_env, wait_for
from tests.hostile.fleet import Fleet
from tests.integration.test_api_server import insert_stranded_successor, spawn_orchestrator

ACCOUNT, REGION = "123456789012", "us-east-1"  # moto's default account
# Calls made before enforcement starts: 3 to create the queue pair, then create_user,
# put_user_policy and create_access_key for each of the three principals.
SETUP_CALLS = 3 + 3 * 3


def documented_policies() -> dict[str, dict[str, Any]]:
    """The worker and orchestrator role policies exactly as docs/how-to/deploy-eks.md prints
    them, for this account and region; and the producer's, which that page states in a sentence."""
    readme = (ROOT / "docs/how-to/deploy-eks.md").read_text()
    found = {}
    for role in ("Worker", "Orchestrator"):
        section = readme[readme.index(f"{role} role policy:"):]
        text = re.search(r"```json\n(.*?)```", section, flags=re.S)
        assert text is not None
        found[role.lower()] = json.loads(text.group(1).replace("REGION", REGION)
                                         .replace("ACCOUNT_ID", ACCOUNT))
    found["producer"] = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": "sqs:SendMessage",
        "Resource": f"arn:aws:sqs:{REGION}:{ACCOUNT}:phasegate.fifo"}]}
    return found


def as_moto_sees_it(policy: dict[str, Any]) -> str:
    """AWS authorises SendMessageBatch by sqs:SendMessage (and likewise for the other batch
    calls); moto checks the batch call's own name. Add those names, nothing else."""
    statements = []
    for statement in policy["Statement"]:
        actions = statement["Action"]
        actions = [actions] if isinstance(actions, str) else list(actions)
        batch = [f"{a}Batch" for a in actions if a in (
            "sqs:SendMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility")]
        statements.append({**statement, "Action": actions + batch})
    return json.dumps({**policy, "Statement": statements})


@pytest.fixture
def enforcing_moto(tmp_path: Path) -> Iterator[str]:
    """moto server in its own process (the setting is read at import) with IAM enforced
    after SETUP_CALLS calls."""
    port = free_port()
    with open(tmp_path / "moto.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_CALLS)},
            stdout=log, stderr=log)
    try:
        asyncio.run(wait_for(lambda: _listening(port), timeout=60, what="moto server"))
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


async def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def set_up(endpoint: str) -> tuple[tuple[str, str], dict[str, dict[str, str]]]:
    session = aioboto3.Session()
    keys: dict[str, dict[str, str]] = {}
    async with session.client("sqs", endpoint_url=endpoint, region_name=REGION) as sqs, \
            session.client("iam", endpoint_url=endpoint, region_name=REGION) as iam:
        pair = await create_fifo_queue_pair(sqs, "phasegate", visibility_timeout_s=3)
        for name, policy in documented_policies().items():
            await iam.create_user(UserName=f"phasegate-{name}")
            await iam.put_user_policy(UserName=f"phasegate-{name}", PolicyName="documented",
                                      PolicyDocument=as_moto_sees_it(policy))
            key = (await iam.create_access_key(UserName=f"phasegate-{name}"))["AccessKey"]
            keys[name] = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                          "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
    return pair, keys


def client_as(keys: dict[str, str], endpoint: str) -> Any:
    session = aioboto3.Session(aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
                               aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
                               region_name=REGION)
    return session.client("sqs", endpoint_url=endpoint)


async def test_documented_policies_let_every_process_do_its_work(enforcing_moto, database_url,
                                                                 tmp_path):
    (queue_url, dlq_url), keys = await set_up(enforcing_moto)
    settings = make_settings(database_url, (queue_url, dlq_url), enforcing_moto)
    start = start_message("iam-1", "chain", {"n": 1})
    async with client_as(keys["producer"], enforcing_moto) as producer:
        await producer.send_message(QueueUrl=queue_url, MessageBody=start.to_json(),
                                    MessageGroupId=start.group_id,
                                    MessageDeduplicationId=start.dedup_id)
        await producer.send_message(QueueUrl=queue_url, MessageBody="{not json",
                                    MessageGroupId="poison", MessageDeduplicationId="p" * 64)
        with pytest.raises(ClientError, match="AccessDenied"):  # enforcement is on
            await producer.receive_message(QueueUrl=queue_url)
    await insert_stranded_successor(database_url)  # the relay must send it
    worker = Fleet(settings, tmp_path, 1, {**keys["worker"],
                                           "PHASEGATE_WORKFLOW_MODULES": "tests.workflows"})
    port = free_port()
    orchestrator = spawn_orchestrator(settings, port, extra_env=keys["orchestrator"])
    relay = spawn_relay(settings, keys["orchestrator"], tmp_path / "relay.log")
    try:
        await wait_for(lambda: all_done(database_url, ["iam-1"]), timeout=90,
                       what="the producer's run completed")
        # The relayed message reached the worker: it halts the run, which has no checkpoint.
        await wait_for(lambda: all_done(database_url, ["stranded"], "failed"), timeout=90,
                       what="the relayed message was sent and received")
        # The quarantine row is written only after the DLQ send succeeded.
        await wait_for(lambda: _quarantined(database_url), what="poison quarantined")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as api:
            await wait_for(lambda: _ready(api), timeout=60, what="orchestrator ready")
            metrics = (await api.get("/metrics")).text
        assert 'phasegate_queue_messages{state="visible"}' in metrics  # the exporter's read
        # The DLQ depth read is allowed too (its own statement in the orchestrator's policy).
        assert 'phasegate_exporter_errors_total{source="dlq"} 0.0' in metrics
        assert worker.alive() == [None] and relay.poll() is None
    finally:
        codes = worker.stop()
        for process in (orchestrator, relay):
            process.send_signal(signal.SIGTERM)
        other = [orchestrator.wait(timeout=30), relay.wait(timeout=30)]
    assert codes == [0] and other == [0, 0]
    logs = worker.log_text() + (tmp_path / "relay.log").read_text()
    assert "AccessDenied" not in logs
    async with client_as(keys["worker"], enforcing_moto) as sqs:  # and nothing more there
        with pytest.raises(ClientError, match="AccessDenied"):
            await sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["All"])


def spawn_relay(settings: Any, keys: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **settings_env(settings), "PHASEGATE_LOG_FORMAT": "json",
           "PYTHONPATH": str(ROOT), **keys}
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "phasegate.cli", "relay"], cwd=ROOT,
                                env=env, stdout=subprocess.DEVNULL, stderr=log)


async def _quarantined(dsn: str) -> bool:
    return int(await fetchval(dsn, "SELECT count(*) FROM quarantine")) == 1


async def _ready(api: httpx.AsyncClient) -> bool:
    try:
        return (await api.get("/readyz")).status_code == 200
    except httpx.TransportError:
        return False
