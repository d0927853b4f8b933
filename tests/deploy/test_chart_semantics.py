"""What structural validation cannot see: the promises the chart makes to the cluster."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.deploy import chart

# The exporter's metric (DESIGN "Scale to zero"; orchestrator exporter contract).
EXPORTED_QUEUE_METRIC = "phasegate_queue_messages"
UID = 10001
AUTOSCALER_KINDS = {"HorizontalPodAutoscaler", "ScaledObject"}
AWS_KEY_ENV = re.compile(r"^AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN)$")


def mode_of(scenario: str) -> str:
    """The autoscaler a scenario renders. The session renders see no KEDA API, so the
    default ``auto`` resolves to the HPA (tests/deploy/test_chart_autoscaling.py covers KEDA)."""
    values = chart.load_values(chart.SCENARIO_DIR / f"{scenario}-values.yaml")
    mode = values.get("autoscaling", {}).get("mode", "auto")
    return "hpa" if mode == "auto" else mode


SCENARIOS = [p.name.removesuffix("-values.yaml") for p in chart.scenarios()]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_exactly_the_autoscaler_of_the_mode(scenario, rendered):
    kinds = [o["kind"] for o in rendered[scenario].objects if o["kind"] in AUTOSCALER_KINDS]
    expected = {"hpa": ["HorizontalPodAutoscaler"], "keda": ["ScaledObject"], "none": []}
    assert kinds == expected[mode_of(scenario)]


def test_scenarios_cover_every_mode():
    assert {mode_of(s) for s in SCENARIOS} == {"hpa", "keda", "none"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_scenario_needs_the_hpa_scale_to_zero_gate(scenario, rendered):
    """Stock EKS has no HPAScaleToZero gate: every HPA the scenarios render keeps a worker,
    and every ScaledObject bounds its range sensibly."""
    for hpa in rendered[scenario].of_kind("HorizontalPodAutoscaler"):
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    for so in rendered[scenario].of_kind("ScaledObject"):
        spec = so["spec"]
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        assert spec["pollingInterval"] >= 1 and spec["cooldownPeriod"] >= 0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_worker_replicas_left_to_the_autoscaler(scenario, rendered):
    worker = rendered[scenario].one("Deployment", "-worker")
    if mode_of(scenario) == "none":
        assert worker["spec"]["replicas"] >= 1
    else:  # a replicas field would fight the autoscaler on every upgrade
        assert "replicas" not in worker["spec"]


def test_hpa_scales_on_visible_plus_inflight(rendered):
    r = rendered["default"]
    hpa = r.one("HorizontalPodAutoscaler")
    spec = hpa["spec"]
    assert spec["minReplicas"] == 1, "stock EKS rejects 0 (no HPAScaleToZero gate)"
    assert spec["maxReplicas"] >= 1
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "name": r.one("Deployment", "-worker")["metadata"]["name"]}
    metric, timers = spec["metrics"]  # the queue; waits due soon (test_chart_timers.py)
    assert timers["external"]["metric"]["name"] == "phasegate_timers_due_soon"
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == EXPORTED_QUEUE_METRIC
    (expr,) = metric["external"]["metric"]["selector"]["matchExpressions"]
    assert expr == {"key": "state", "operator": "In", "values": ["visible", "inflight"]}
    assert metric["external"]["target"]["type"] == "AverageValue"
    assert int(metric["external"]["target"]["averageValue"]) >= 1
    down = spec["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 60
    assert down["policies"]


def test_prometheus_adapter_rule_serves_the_hpa_metric(rendered):
    r = rendered["default"]
    hpa_metric = r.one("HorizontalPodAutoscaler")["spec"]["metrics"][0]["external"]["metric"]
    cm = r.one("ConfigMap", "-prometheus-adapter-rules")
    rule, _timers = yaml.safe_load(cm["data"]["config.yaml"])["externalRules"]
    assert rule["name"]["as"] == hpa_metric["name"] == EXPORTED_QUEUE_METRIC
    assert rule["seriesQuery"].startswith(EXPORTED_QUEUE_METRIC + "{")
    assert rule["resources"]["overrides"]["namespace"]["resource"] == "namespace"
    # The state label must survive the query, or the HPA's state selector matches nothing;
    # and replicas of the orchestrator export the same gauge, so they must not be summed.
    assert "max by (namespace, state)" in rule["metricsQuery"]
    assert "<<.LabelMatchers>>" in rule["metricsQuery"]


def test_hpa_metric_is_what_the_orchestrator_exports(rendered):
    """The HPA's metric name and state selector match the exporter's gauge and label values."""
    from phasegate.orchestrator.exporter import QUEUE_MESSAGES

    (family,) = QUEUE_MESSAGES.collect()
    assert family.name == EXPORTED_QUEUE_METRIC
    exported_states = {sample.labels["state"] for sample in family.samples}
    metric = rendered["default"].one("HorizontalPodAutoscaler")["spec"]["metrics"][0]
    assert metric["external"]["metric"]["name"] == family.name
    (expr,) = metric["external"]["metric"]["selector"]["matchExpressions"]
    assert set(expr["values"]) == {"visible", "inflight"} <= exported_states


@pytest.mark.parametrize("scenario", ["keda", "fargate"])
def test_keda_scaledobject_fields(scenario, rendered):
    r = rendered[scenario]
    values = chart.merge_values(
        chart.load_values(chart.CHART_DIR / "values.yaml"),
        chart.load_values(chart.SCENARIO_DIR / f"{scenario}-values.yaml"))
    so = r.one("ScaledObject")["spec"]
    assert so["minReplicaCount"] == 0
    assert so["maxReplicaCount"] == values["autoscaling"]["maxReplicas"]
    assert so["scaleTargetRef"]["name"] == r.one("Deployment", "-worker")["metadata"]["name"]
    trigger, timers = so["triggers"]  # the queue; waits due soon (test_chart_timers.py)
    assert timers["type"] == "metrics-api"
    assert trigger["type"] == "aws-sqs-queue"
    meta = trigger["metadata"]
    assert meta["queueURL"] == values["config"]["queueUrl"]
    assert meta["awsRegion"] == values["config"]["awsRegion"]
    assert meta["queueLength"] == str(values["autoscaling"]["messagesPerWorker"])
    assert meta["scaleOnInFlight"] == "true"
    auth = r.one("TriggerAuthentication")
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert auth["spec"]["podIdentity"]["provider"] == "aws"
    assert "secretTargetRef" not in auth["spec"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_restricted_security_on_every_pod_and_container(scenario, rendered):
    pods = rendered[scenario].pod_specs()
    assert {name.rsplit("-", 1)[-1] for name, _ in pods} == {"worker", "orchestrator", "migrate"}
    for name, pod in pods:
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True, name
        assert psc["runAsUser"] == UID, name
        assert psc["seccompProfile"]["type"] == "RuntimeDefault", name
        # Only the orchestrator reads the Kubernetes API (the fleet view, on by default);
        # tests/deploy/test_chart_fleet_rbac.py covers the switch.
        assert pod["automountServiceAccountToken"] is name.endswith("-orchestrator"), name
        assert not pod.get("hostNetwork") and not pod.get("hostPID"), name
        assert all("hostPath" not in v for v in pod.get("volumes", [])), name
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == UID, c["name"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", c["name"]
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            tmp = next(v for v in pod["volumes"] if v["name"] == mounts["/tmp"])
            assert "emptyDir" in tmp, c["name"]
            assert c["resources"]["requests"]["memory"], c["name"]
            assert c["resources"]["limits"]["memory"], c["name"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_static_aws_keys_anywhere(scenario, rendered):
    for obj in rendered[scenario].objects:
        text = yaml.safe_dump(obj)
        assert "AWS_SECRET_ACCESS_KEY" not in text and "AWS_ACCESS_KEY_ID" not in text
        assert "aws_secret_access_key" not in text.lower()
    for _, pod in rendered[scenario].pod_specs():
        for c in pod["containers"]:
            assert not [e["name"] for e in c.get("env", []) if AWS_KEY_ENV.match(e["name"])]


@pytest.mark.parametrize("scenario", ["default", "keda", "fargate", "external-secret"])
def test_service_accounts_carry_irsa_roles(scenario, rendered):
    r = rendered[scenario]
    accounts = {sa["metadata"]["name"]: sa for sa in r.of_kind("ServiceAccount")}
    for name, pod in r.pod_specs():
        if name.endswith("-migrate"):
            continue  # migrations need the database only
        sa = accounts[pod["serviceAccountName"]]
        assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith(
            "arn:aws:iam::")
    roles = {sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
             for sa in accounts.values()}
    assert len(roles) == 2, "worker and orchestrator get separate least-privilege roles"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_database_url_only_from_a_secret(scenario, rendered):
    for _, pod in rendered[scenario].pod_specs():
        for c in pod["containers"]:
            (env,) = [e for e in c["env"] if e["name"] == "PHASEGATE_DATABASE_URL"]
            assert "value" not in env and env["valueFrom"]["secretKeyRef"]["name"]
    for cm in rendered[scenario].of_kind("ConfigMap"):
        assert "postgresql://" not in yaml.safe_dump(cm.get("data", {}))


def test_existing_secret_means_no_chart_secret(rendered):
    r = rendered["external-secret"]
    assert r.of_kind("Secret") == []
    keys = {}
    for name, pod in r.pod_specs():
        ref = pod["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "phasegate-db-from-vault"
        keys[name.rsplit("-", 1)[-1]] = ref["key"]
    # Each process reads only its own DSN (database.secretKeys).
    assert keys == {"worker": "worker-dsn", "orchestrator": "orchestrator-dsn",
                    "migrate": "owner-dsn"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_grace_exceeds_shutdown_grace_plus_margin(scenario, rendered):
    r = rendered[scenario]
    config = r.one("ConfigMap", "-config")["data"]
    pod = r.one("Deployment", "-worker")["spec"]["template"]["spec"]
    shutdown_grace = float(config["PHASEGATE_SHUTDOWN_GRACE_S"])
    assert pod["terminationGracePeriodSeconds"] > shutdown_grace + 5
    assert float(config["PHASEGATE_HEARTBEAT_S"]) < float(config["PHASEGATE_VISIBILITY_TIMEOUT_S"])


def test_too_short_grace_fails_with_a_clear_message(minimal_values, helm_home):
    values = chart.merge_values(minimal_values, {"worker": {
        "shutdownGraceSeconds": 60, "shutdownMarginSeconds": 10,
        "terminationGracePeriodSeconds": 65}})
    with pytest.raises(chart.RenderError) as caught:
        chart.render(values)
    assert ("worker.terminationGracePeriodSeconds (65) must be greater than "
            "worker.shutdownGraceSeconds (60) + worker.shutdownMarginSeconds (10)"
            ) in str(caught.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"database": {"url": "", "existingSecret": ""}},
         "set database.urls (one DSN per process), database.url or database.existingSecret"),
        ({"database": {"existingSecret": "x"}}, "set only one of database.url"),
        ({"config": {"queueUrl": "https://sqs.eu-west-1.amazonaws.com/1/std"}}, "FIFO queue"),
        ({"worker": {"heartbeatSeconds": 30}},
         "must be shorter than worker.visibilityTimeoutSeconds"),
        # No pooler declared: 200 workers x 4 + the orchestrator's 2 pools of 4 > 90.
        ({"database": {"pooler": "none"}, "autoscaling": {"mode": "hpa", "maxReplicas": 200}},
         "200 workers x database.poolMax 4 + the orchestrator's 4 = 804 connections exceed "
         "database.connectionBudget (90)"),
        ({"database": {"pooler": "none", "poolMax": 30, "connectionBudget": 100},
          "autoscaling": {"mode": "none"}, "worker": {"replicas": 3}},
         "3 workers x database.poolMax 30 + the orchestrator's 30 = 120 connections exceed "
         "database.connectionBudget (100)"),
    ],
)
def test_bad_combinations_fail_with_a_clear_message(override, message, minimal_values, helm_home):
    with pytest.raises(chart.RenderError, match=re.escape(message)):
        chart.render(chart.merge_values(minimal_values, override))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_migration_hook_runs_before_install_and_upgrade(scenario, rendered):
    r = rendered[scenario]
    job = r.one("Job", "-migrate")
    hooks = job["metadata"]["annotations"]["helm.sh/hook"].split(",")
    assert set(hooks) == {"pre-install", "pre-upgrade"}
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    # A pre-install hook runs before the release's ordinary objects exist: everything the Job
    # reads must be a hook itself (lower weight) or exist outside the release.
    secret = container["env"][0]["valueFrom"]["secretKeyRef"]["name"]
    owned = {s["metadata"]["name"]: s for s in r.of_kind("Secret")}
    if secret in owned:
        ann = owned[secret]["metadata"]["annotations"]
        assert "pre-install" in ann["helm.sh/hook"]
        job_weight = int(job["metadata"]["annotations"]["helm.sh/hook-weight"])
        assert int(ann["helm.sh/hook-weight"]) < job_weight
    assert "envFrom" not in container


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_workers_and_orchestrator_run_the_right_commands(scenario, rendered):
    r = rendered[scenario]
    worker = r.one("Deployment", "-worker")["spec"]["template"]["spec"]["containers"][0]
    orch = r.one("Deployment", "-orchestrator")["spec"]["template"]["spec"]["containers"][0]
    assert worker["args"] == ["worker"] and orch["args"] == ["orchestrator"]
    env = {e["name"]: e.get("value") for e in orch["env"]}
    assert env["PHASEGATE_API_HOST"] == "0.0.0.0"
    for c, port in ((worker, "metrics"), (orch, "http")):
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}
        assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}
        assert c["startupProbe"]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_orchestrator_pdb_matches_its_pods(scenario, rendered):
    r = rendered[scenario]
    pdbs = r.of_kind("PodDisruptionBudget")
    orch = r.one("Deployment", "-orchestrator")
    if scenario == "minimal":
        assert pdbs == []
        return
    (pdb,) = pdbs
    assert pdb["spec"]["selector"]["matchLabels"] == orch["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["maxUnavailable"] < orch["spec"]["replicas"]


def test_fargate_pods_are_selectable_and_node_free(rendered):
    for _, pod in rendered["fargate"].pod_specs():
        assert not pod.get("nodeSelector") and not pod.get("tolerations")
    for obj in rendered["fargate"].objects:
        if obj["kind"] in {"Deployment", "Job"}:
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert labels["phasegate.io/compute"] == "fargate"
    assert rendered["fargate"].of_kind("DaemonSet") == []


# Fargate pod sizes (vCPU -> memory GiB) and the memory it adds for its own components.
FARGATE_SIZES = {0.25: {0.5, 1, 2}, 0.5: set(range(1, 5)), 1: set(range(2, 9)),
                 2: set(range(4, 17)), 4: set(range(8, 31))}
FARGATE_OVERHEAD_MIB = 256


def test_fargate_requests_land_on_a_fargate_size(rendered):
    for name in ("-worker", "-orchestrator"):
        (container,) = rendered["fargate"].one("Deployment", name)["spec"]["template"]["spec"][
            "containers"]
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert requests == limits, "on Fargate the pod is sized once; limits add nothing"
        cpu = int(requests["cpu"].removesuffix("m")) / 1000
        memory_mib = int(requests["memory"].removesuffix("Mi"))
        assert (memory_mib + FARGATE_OVERHEAD_MIB) / 1024 in FARGATE_SIZES[cpu], name


def test_optional_objects_follow_their_switches(rendered):
    default, minimal = rendered["default"], rendered["minimal"]
    assert default.of_kind("ServiceMonitor") and not minimal.of_kind("ServiceMonitor")
    assert default.of_kind("NetworkPolicy") and minimal.of_kind("NetworkPolicy")  # on by default
    dashboards = [c for c in default.of_kind("ConfigMap")
                  if c["metadata"]["name"].endswith("-dashboard")]
    assert dashboards and dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = yaml.safe_load(dashboards[0]["data"]["phasegate.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    assert EXPORTED_QUEUE_METRIC in exprs and "phasegate_oldest_unfinished_run_age_seconds" in exprs


def _mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity.removesuffix(suffix)) * factor
    return float(quantity) / 2**20


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "fargate"])
def test_worker_memory_limit_leaves_room_for_an_emergency_flush(scenario, rendered):
    # On Fargate the pod is sized once (limits = requests); elsewhere the worker may grow past
    # its request while it persists in-phase progress under memory pressure.
    (container,) = rendered[scenario].one("Deployment", "-worker")["spec"]["template"]["spec"][
        "containers"]
    resources = container["resources"]
    request = _mebibytes(resources["requests"]["memory"])
    assert _mebibytes(resources["limits"]["memory"]) >= 1.5 * request


@pytest.mark.parametrize("override", [
    {"autoscaling": {"mode": "hpa", "maxReplicas": 1000}},  # a pooler is declared (default)
    # PgBouncer with statements named by their text: a pooler too, so no budget check.
    {"database": {"pooler": "pgbouncer"}, "autoscaling": {"mode": "hpa", "maxReplicas": 1000}},
    {"database": {"pooler": "none"}, "autoscaling": {"mode": "hpa", "maxReplicas": 20}},
    {"database": {"pooler": "none", "connectionBudget": 0},  # 0: the check is off
     "autoscaling": {"mode": "hpa", "maxReplicas": 200}},
])
def test_connection_budget_applies_only_without_a_pooler(override, minimal_values, helm_home):
    rendered = chart.render(chart.merge_values(minimal_values, override))
    config = rendered.one("ConfigMap", "-config")["data"]
    assert config["PHASEGATE_DATABASE_POOLER"] == override.get("database", {}).get(
        "pooler", "transaction")
    assert config["PHASEGATE_DB_POOL_MAX"] == "4"
