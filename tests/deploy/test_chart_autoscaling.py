"""The chart's defaults on stock EKS: installable without KEDA and without the HPAScaleToZero
gate, scale to zero when KEDA is there, and the KEDA options users ask for."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import chart
from tests.deploy.validate import validate_object


def minimal() -> dict[str, Any]:
    return chart.load_values(chart.SCENARIO_DIR / "minimal-values.yaml")


def with_keda(values: dict[str, Any]) -> chart.Rendered:
    return chart.render(values, api_versions=chart.KEDA_API_VERSIONS)


def autoscalers(rendered: chart.Rendered) -> list[str]:
    return [o["kind"] for o in rendered.objects
            if o["kind"] in {"HorizontalPodAutoscaler", "ScaledObject"}]


def test_minimal_values_without_keda_render_an_hpa_eks_accepts(helm_home):
    rendered = chart.render(minimal())
    assert autoscalers(rendered) == ["HorizontalPodAutoscaler"]
    hpa = rendered.one("HorizontalPodAutoscaler")["spec"]
    # No HPAScaleToZero gate on stock EKS: 0 would be rejected by the API server.
    assert hpa["minReplicas"] == 1 <= hpa["maxReplicas"]
    assert "replicas" not in rendered.one("Deployment", "-worker")["spec"]
    assert rendered.one("ConfigMap", "-prometheus-adapter-rules")
    for obj in rendered.objects:
        validate_object(obj)
    assert "native HPA, because autoscaling.mode is auto and this cluster does not serve " \
           "keda.sh/v1alpha1 ScaledObject" in rendered.notes
    assert "minReplicas 1: no scale to zero" in rendered.notes


def test_minimal_values_with_keda_scale_to_zero_on_the_queue(helm_home):
    rendered = with_keda(minimal())
    assert autoscalers(rendered) == ["ScaledObject"]
    spec = rendered.one("ScaledObject")["spec"]
    assert spec["minReplicaCount"] == 0
    trigger, timers = spec["triggers"]  # the queue, and waits due soon (test_chart_timers.py)
    assert trigger["type"] == "aws-sqs-queue" and timers["type"] == "metrics-api"
    assert trigger["metadata"]["scaleOnInFlight"] == "true"
    auth = rendered.one("TriggerAuthentication")
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"],
                                            "kind": "TriggerAuthentication"}
    assert not [o for o in rendered.objects if o["metadata"]["name"].endswith(
        "-prometheus-adapter-rules")], "no adapter rule without an HPA"
    for obj in rendered.objects:
        validate_object(obj)
    assert "KEDA ScaledObject, because autoscaling.mode is auto and this cluster serves" \
        in rendered.notes


def test_an_explicit_mode_wins_over_detection(helm_home):
    hpa = chart.merge_values(minimal(), {"autoscaling": {"mode": "hpa"}})
    assert autoscalers(with_keda(hpa)) == ["HorizontalPodAutoscaler"]
    keda = chart.merge_values(minimal(), {"autoscaling": {"mode": "keda"}})
    assert autoscalers(chart.render(keda)) == ["ScaledObject"]
    none = chart.merge_values(minimal(), {"autoscaling": {"mode": "none"}})
    rendered = with_keda(none)
    assert autoscalers(rendered) == []
    assert rendered.one("Deployment", "-worker")["spec"]["replicas"] == 1
    assert "Autoscaling: off, because autoscaling.mode is none" in rendered.notes


def test_hpa_scale_to_zero_only_when_the_gate_is_declared(helm_home):
    gate = chart.merge_values(minimal(), {"autoscaling": {"hpa": {"scaleToZero": True}}})
    rendered = chart.render(gate)
    assert rendered.one("HorizontalPodAutoscaler")["spec"]["minReplicas"] == 0
    assert "HPAScaleToZero feature gate" in rendered.notes
    zero = chart.merge_values(minimal(), {"autoscaling": {"hpa": {"minReplicas": 0}}})
    with pytest.raises(chart.RenderError, match="HPAScaleToZero"):
        chart.render(zero)


def test_keda_options_render_where_keda_reads_them(helm_home):
    values = chart.merge_values(minimal(), {"autoscaling": {"maxReplicas": 30, "keda": {
        "minReplicaCount": 1, "idleReplicaCount": 0, "pollingInterval": 5,
        "cooldownPeriod": 120, "paused": True, "pausedReplicas": 2,
        "fallback": {"enabled": True, "failureThreshold": 4, "replicas": 3}}}})
    so = with_keda(values).one("ScaledObject")
    validate_object(so)
    spec = so["spec"]
    assert (spec["minReplicaCount"], spec["idleReplicaCount"],
            spec["maxReplicaCount"]) == (1, 0, 30)
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (5, 120)
    assert spec["fallback"] == {"failureThreshold": 4, "replicas": 3}
    assert so["metadata"]["annotations"] == {"autoscaling.keda.sh/paused": "true",
                                             "autoscaling.keda.sh/paused-replicas": "2"}
    plain = with_keda(minimal()).one("ScaledObject")
    assert "annotations" not in plain["metadata"]
    assert "fallback" not in plain["spec"] and "idleReplicaCount" not in plain["spec"]


def test_idle_replica_count_must_sit_below_the_minimum(helm_home):
    values = chart.merge_values(minimal(), {"autoscaling": {"keda": {"idleReplicaCount": 0}}})
    with pytest.raises(chart.RenderError, match="idleReplicaCount"):
        with_keda(values)


def test_cluster_trigger_authentication_and_an_existing_one(helm_home):
    cluster = chart.merge_values(minimal(), {"autoscaling": {"keda": {"authentication": {
        "kind": "ClusterTriggerAuthentication"}}}})
    rendered = with_keda(cluster)
    auth = rendered.one("ClusterTriggerAuthentication")
    validate_object(auth)
    ref = rendered.one("ScaledObject")["spec"]["triggers"][0]["authenticationRef"]
    assert ref == {"name": auth["metadata"]["name"], "kind": "ClusterTriggerAuthentication"}
    assert not rendered.of_kind("TriggerAuthentication")

    existing = chart.merge_values(minimal(), {"autoscaling": {"keda": {"authentication": {
        "create": False, "name": "shared-sqs"}}}})
    rendered = with_keda(existing)
    assert not rendered.of_kind("TriggerAuthentication")
    ref = rendered.one("ScaledObject")["spec"]["triggers"][0]["authenticationRef"]
    assert ref == {"name": "shared-sqs", "kind": "TriggerAuthentication"}
    missing = chart.merge_values(minimal(), {"autoscaling": {"keda": {"authentication": {
        "create": False}}}})
    with pytest.raises(chart.RenderError, match=r"authentication\.name"):
        with_keda(missing)


def test_common_labels_version_and_part_of_on_every_pod_template(helm_home):
    values = chart.merge_values(minimal(), {
        "commonLabels": {"team": "data", "eks.amazonaws.com/fargate-profile": "phasegate"},
        "worker": {"podLabels": {"tier": "batch"}}})
    rendered = chart.render(values, is_upgrade=True)  # upgrade: the gate Job renders too
    templates = {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
                 for o in rendered.objects if o["kind"] in {"Deployment", "Job"}}
    assert set(templates) == {"pg-phasegate-worker", "pg-phasegate-orchestrator",
                              "pg-phasegate-migrate", "pg-phasegate-upgrade-gate"}
    for name, labels in templates.items():
        assert labels["team"] == "data", name
        assert labels["eks.amazonaws.com/fargate-profile"] == "phasegate", name
        assert labels["app.kubernetes.io/version"] == "0.1.0", name
        assert labels["app.kubernetes.io/part-of"] == "phasegate", name
    assert templates["pg-phasegate-worker"]["tier"] == "batch"
    for obj in rendered.objects:
        assert obj["metadata"]["labels"]["team"] == "data", obj["metadata"]["name"]
    # Selectors stay stable across upgrades: never the version or user labels.
    selector = rendered.one("Deployment", "-worker")["spec"]["selector"]["matchLabels"]
    assert set(selector) == {"app.kubernetes.io/name", "app.kubernetes.io/instance",
                             "app.kubernetes.io/component"}
