"""Scale from zero ahead of durable waits: the autoscaler also sees phasegate_timers_due_soon
(waits due within the next minute), on by default, in both autoscaler modes."""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy import chart
from tests.deploy.validate import validate_object


def minimal(**wake: Any) -> dict[str, Any]:
    values = chart.load_values(chart.SCENARIO_DIR / "minimal-values.yaml")
    if wake:
        values.setdefault("autoscaling", {})["wakeOnTimers"] = wake
    return values


def test_keda_reads_due_timers_from_the_orchestrators_metrics(helm_home):
    rendered = chart.render(minimal(), api_versions=chart.KEDA_API_VERSIONS)
    triggers = rendered.one("ScaledObject")["spec"]["triggers"]
    timers = [t for t in triggers if t["type"] == "metrics-api"]
    assert len(timers) == 1
    meta = timers[0]["metadata"]
    service = rendered.one("Service", "-orchestrator")
    port = service["spec"]["ports"][0]["port"]
    assert meta["url"] == (f"http://{service['metadata']['name']}."
                           f"{service['metadata'].get('namespace', chart.NAMESPACE)}.svc:"
                           f"{port}/metrics")
    assert meta["format"] == "prometheus"
    assert meta["valueLocation"] == "phasegate_timers_due_soon"
    assert meta["activationTargetValue"] == "0"  # one due wait wakes the first worker
    # The NetworkPolicy lets KEDA's namespace reach that port.
    policy = rendered.one("NetworkPolicy", "-orchestrator")
    assert {"from": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "keda"}}}],
            "ports": [{"protocol": "TCP", "port": port}]} in policy["spec"]["ingress"]
    for obj in rendered.objects:
        validate_object(obj)


def test_hpa_scales_on_due_timers_through_prometheus_adapter(helm_home):
    rendered = chart.render(minimal(timersPerWorker=2, enabled=True))
    metrics = rendered.one("HorizontalPodAutoscaler")["spec"]["metrics"]
    names = [m["external"]["metric"]["name"] for m in metrics]
    assert names == ["phasegate_queue_messages", "phasegate_timers_due_soon"]
    assert metrics[1]["external"]["target"] == {"type": "AverageValue", "averageValue": "2"}
    rules = yaml.safe_load(rendered.one("ConfigMap", "-prometheus-adapter-rules")["data"][
        "config.yaml"])["externalRules"]
    assert [r["name"]["as"] for r in rules] == names
    for obj in rendered.objects:
        validate_object(obj)


def test_wake_on_timers_can_be_turned_off(helm_home):
    keda = chart.render(minimal(enabled=False, timersPerWorker=4),
                        api_versions=chart.KEDA_API_VERSIONS)
    assert [t["type"] for t in keda.one("ScaledObject")["spec"]["triggers"]] == [
        "aws-sqs-queue"]
    policy = keda.one("NetworkPolicy", "-orchestrator")
    assert len(policy["spec"]["ingress"]) == 2
    hpa = chart.render(minimal(enabled=False, timersPerWorker=4))
    assert len(hpa.one("HorizontalPodAutoscaler")["spec"]["metrics"]) == 1
