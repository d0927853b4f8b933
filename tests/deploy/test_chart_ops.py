"""The ops pack in the chart: the PrometheusRule's alerts read metrics phasegate exports,
the dashboard shows what an operator needs, the pre-upgrade replay gate, and the worker's
deletion-cost RBAC."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.deploy import chart

ALERTS = {"PhasegateQueueAgeRising", "PhasegateRunsStalled", "PhasegateDeadLetterQueueNotEmpty",
          "PhasegateOutboxLag", "PhasegateWatchdogFlushes", "PhasegateWorkerRestarts"}
# Metrics that come from kube-state-metrics, not from phasegate.
EXTERNAL = {"kube_pod_container_status_restarts_total", "kube_deployment_status_replicas"}


def exported_metric_names() -> set[str]:
    """Every family the worker and orchestrator register, with histogram/counter suffixes."""
    import importlib

    from prometheus_client import REGISTRY

    # Imported for what they register in the default registry.
    for module in ("phasegate.orchestrator.exporter", "phasegate.orchestrator.relay",
                   "phasegate.worker.deletion_cost", "phasegate.worker.emergency",
                   "phasegate.metrics", "phasegate.worker.watchdog"):
        importlib.import_module(module)

    names: set[str] = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        names.update(f"{family.name}{suffix}" for suffix in ("_total", "_count", "_sum", "_bucket"))
    return names


def metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"\b(phasegate_[a-z_]+|kube_[a-z_]+)\b", expr))


def default_values() -> dict[str, Any]:
    return chart.load_values(chart.SCENARIO_DIR / "default-values.yaml")


def test_prometheus_rule_alerts_on_metrics_phasegate_exports(rendered):
    rule = rendered["default"].one("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == ALERTS
    known = exported_metric_names() | EXTERNAL
    for name, alert in alerts.items():
        used = metrics_in(alert["expr"])
        assert used, name
        assert used <= known, f"{name} reads metrics nobody exports: {used - known}"
        assert 'namespace="jobs"' in alert["expr"], f"{name} must stay in its namespace"
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}
        assert alert["annotations"]["summary"]
    assert "phasegate_dlq_messages" in alerts["PhasegateDeadLetterQueueNotEmpty"]["expr"]
    assert 'phasegate_runs{namespace="jobs",status="running"}' in \
        alerts["PhasegateRunsStalled"]["expr"]


def test_prometheus_rule_is_optional(rendered):
    for scenario in ("minimal", "keda", "fargate"):
        assert not rendered[scenario].of_kind("PrometheusRule")


def test_dashboard_panels_cover_the_operators_questions(rendered):
    cm = rendered["default"].one("ConfigMap", "-dashboard")
    (text,) = cm["data"].values()
    dashboard = json.loads(text)
    exprs = {p["title"]: " ".join(t["expr"] for t in p.get("targets", []))
             for p in dashboard["panels"]}
    joined = " ".join(exprs.values())
    assert "histogram_quantile(0.95" in joined and "by (le, phase)" in joined
    for metric in ("phasegate_phase_duration_seconds_bucket", "phasegate_messages_total",
                   "phasegate_outbox_lag_seconds", "phasegate_sqs_errors_total",
                   "phasegate_emergency_flush_total", "phasegate_dlq_messages",
                   "phasegate_runs"):
        assert metric in joined, metric
    known = exported_metric_names() | EXTERNAL | {"process_resident_memory_bytes",
                                                  "process_cpu_seconds_total"}
    for title, expr in exprs.items():
        assert metrics_in(expr) <= known, title


def test_upgrade_gate_runs_the_new_image_before_an_upgrade_only(helm_home):
    install = chart.render(default_values())
    assert not [o for o in install.objects if o["metadata"]["name"].endswith("-upgrade-gate")]
    upgrade = chart.render(default_values(), is_upgrade=True)
    job = upgrade.one("Job", "-upgrade-gate")
    notes = job["metadata"]["annotations"]
    assert notes["helm.sh/hook"] == "pre-upgrade"
    migrate = upgrade.one("Job", "-migrate")
    assert int(notes["helm.sh/hook-weight"]) > int(
        migrate["metadata"]["annotations"]["helm.sh/hook-weight"]), "after the migrations"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == upgrade.one("Deployment", "-worker")["spec"]["template"][
        "spec"]["containers"][0]["image"], "the new image checks the runs"
    assert container["args"] == ["versions", "--max-restart-share", "0.05"]
    env = {e["name"]: e for e in container["env"]}
    assert env["PHASEGATE_WORKFLOW_MODULES"]["value"] == "myflows.storm"
    secret = env["PHASEGATE_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"]
    hook_secret = upgrade.one("Secret", "-upgrade-gate-database")
    assert hook_secret["metadata"]["name"] == secret
    assert hook_secret["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    assert job["spec"]["backoffLimit"] == 0

    off = chart.merge_values(default_values(), {"upgradeGate": {"enabled": False}})
    assert chart.render(off, is_upgrade=True).one("Job", "-migrate")  # migrations stay
    assert not [o for o in chart.render(off, is_upgrade=True).objects
                if o["metadata"]["name"].endswith("-upgrade-gate")]
    share = chart.merge_values(default_values(), {"upgradeGate": {"maxRestartShare": 0.2}})
    gate = chart.render(share, is_upgrade=True).one("Job", "-upgrade-gate")
    assert gate["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "0.2"


def test_deletion_cost_is_off_by_default_and_grants_only_pod_get_and_patch(rendered, helm_home):
    worker = rendered["default"].one("Deployment", "-worker")["spec"]["template"]["spec"]
    assert worker["automountServiceAccountToken"] is False
    assert not [r for r in rendered["default"].of_kind("Role")
                if r["metadata"]["name"].endswith("-worker-deletion-cost")]

    on = chart.merge_values(default_values(), {"worker": {"deletionCost": {"enabled": True}}})
    r = chart.render(on)
    pod = r.one("Deployment", "-worker")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["PHASEGATE_DELETION_COST"]["value"] == "true"
    assert env["PHASEGATE_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    role = r.one("Role", "-worker-deletion-cost")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "patch"]}]
    binding = r.one("RoleBinding", "-worker-deletion-cost")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]


def test_chart_metadata_for_registries():
    import yaml

    meta = yaml.safe_load((chart.CHART_DIR / "Chart.yaml").read_text())
    assert meta["home"].startswith("https://") and meta["sources"]
    assert meta["icon"].startswith("https://") and meta["icon"].endswith(".svg")
    assert (chart.ROOT / "docs" / "assets" / meta["icon"].rsplit("/", 1)[-1]).exists()
    annotations = meta["annotations"]
    assert annotations["artifacthub.io/license"] == "Apache-2.0"
    (image,) = yaml.safe_load(annotations["artifacthub.io/images"])
    assert image["image"] == f"phasegate:{meta['appVersion']}"
