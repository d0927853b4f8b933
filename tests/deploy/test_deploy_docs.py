"""The deploy pages of the docs are copy-paste material: their JSON must parse, their IAM
policies must grant what the worker and orchestrator call, and their prometheus-adapter rule
must be the chart's."""

from __future__ import annotations

import json
import re

import yaml

from tests.deploy import chart

# Install on EKS/Fargate, without Helm (kustomize), and the local stack: the pages the chart,
# the manifests and localstack/ point readers to.
DEPLOY_PAGES = ("docs/how-to/deploy-eks.md", "docs/how-to/kustomize.md",
                "docs/how-to/local-stack.md")
DOC = "\n".join((chart.ROOT / page).read_text() for page in DEPLOY_PAGES)
# What the worker calls on its queue (GetQueueAttributes: the FifoQueue check at startup and
# the depth in burst mode); on the DLQ it only sends, and it never probes it (a probe there
# needed GetQueueAttributes the policy does not grant, and the worker could not start).
# tests/hostile/test_iam.py proves these on moto with IAM enforced.
WORKER_QUEUE_ACTIONS = {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility",
                        "sqs:SendMessage", "sqs:GetQueueAttributes"}
KMS_ACTIONS = {"kms:GenerateDataKey", "kms:Decrypt"}


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S)


def policies() -> list[dict]:
    return [json.loads(b) for b in blocks("json")]


def grants(policy: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for statement in policy["Statement"]:
        actions = statement["Action"]
        actions = [actions] if isinstance(actions, str) else actions
        out.setdefault(statement["Resource"], set()).update(actions)
    return out


def test_the_pages_the_chart_and_manifests_link_to_exist_and_are_in_the_site():
    nav = (chart.ROOT / "mkdocs.yml").read_text()
    for page in DEPLOY_PAGES:
        assert page.removeprefix("docs/") in nav, page
    assert DOC.startswith("# Deploy on EKS/Fargate\n") and "\n# Local stack\n" in DOC


def test_every_json_block_parses_and_keys_are_never_static():
    assert len(policies()) == 3
    assert "AWS_SECRET_ACCESS_KEY=test" in DOC  # only the LocalStack dummies
    assert DOC.count("AWS_SECRET_ACCESS_KEY") == 1


def test_worker_policy_covers_every_call_the_worker_makes():
    trust, worker, orchestrator = policies()
    assert trust["Statement"][0]["Action"] == "sts:AssumeRoleWithWebIdentity"
    g = grants(worker)
    assert g["arn:aws:sqs:REGION:ACCOUNT_ID:phasegate.fifo"] == WORKER_QUEUE_ACTIONS
    assert g["arn:aws:sqs:REGION:ACCOUNT_ID:phasegate-dlq.fifo"] == {"sqs:SendMessage"}
    assert g["arn:aws:kms:REGION:ACCOUNT_ID:key/KEY_ID"] == KMS_ACTIONS
    g = grants(orchestrator)
    assert g["arn:aws:sqs:REGION:ACCOUNT_ID:phasegate.fifo"] == {
        "sqs:SendMessage", "sqs:GetQueueAttributes"}
    assert g["arn:aws:kms:REGION:ACCOUNT_ID:key/KEY_ID"] == KMS_ACTIONS


def test_adapter_rule_in_the_docs_is_the_charts(rendered):
    (doc_values,) = [yaml.safe_load(b) for b in blocks("yaml") if "externalRules" not in b
                     and "rules:" in b]
    cm = rendered["default"].one("ConfigMap", "-prometheus-adapter-rules")
    assert doc_values["rules"]["external"] == yaml.safe_load(cm["data"]["config.yaml"])[
        "externalRules"]


def test_queue_snippet_sets_fifo_redrive_kms_and_visibility():
    (snippet,) = [b for b in blocks("bash") if "create-queue" in b]
    for attribute in ('"FifoQueue": "true"', '"KmsMasterKeyId"', '"RedrivePolicy"',
                      '"VisibilityTimeout": "$VISIBILITY"'):
        assert attribute in snippet
    values = chart.load_values(chart.CHART_DIR / "values.yaml")
    assert f"VISIBILITY={values['worker']['visibilityTimeoutSeconds']}" in snippet


def test_the_documented_values_install(helm_home):
    (example,) = [b for b in blocks("yaml") if "fargate:" in b and "config:" in b]
    filled = example.replace("ACCOUNT_ID", "123456789012").replace("REGION", "eu-west-1")
    # The page installs KEDA first, so `auto` finds its API.
    rendered = chart.render(yaml.safe_load(filled), api_versions=chart.KEDA_API_VERSIONS)
    kinds = {o["kind"] for o in rendered.objects}
    assert "ScaledObject" in kinds and "HorizontalPodAutoscaler" not in kinds
    labels = rendered.one("Deployment", "-worker")["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "data-platform"
    assert not rendered.of_kind("Secret")  # the DSN comes from the Secret created beforehand
