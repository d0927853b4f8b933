"""Least privilege in the chart: each process connects with its own DSN, the API tokens come
from a read-only Secret, kubernetes auth may review tokens and nothing more, and the
NetworkPolicies (on by default) admit only labelled clients -- never the worker pods, which
run workflow code -- to the API.

NetworkPolicies are checked by evaluating them, as a CNI would, for concrete pods."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy import chart
from tests.deploy.validate import validate_object

NAMESPACE_LABELS = {"kubernetes.io/metadata.name": chart.NAMESPACE}
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}
URLS = {"database": {"url": "", "urls": {
    "migrate": "postgresql://owner:pw@db:5432/pg", "worker": "postgresql://wk:pw@db:5432/pg",
    "orchestrator": "postgresql://orch:pw@db:5432/pg"}}}


def render(minimal_values: dict[str, Any], *overrides: dict[str, Any]) -> chart.Rendered:
    values = minimal_values
    for override in overrides:
        values = chart.merge_values(values, override)
    rendered = chart.render(values)
    for obj in rendered.objects:
        validate_object(obj)
    return rendered


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def admitted(policy: dict[str, Any], port: int, pod_labels: dict[str, str],
             namespace_labels: dict[str, str]) -> bool:
    """Would ``policy`` admit a TCP connection to ``port`` from this pod?"""
    same_namespace = namespace_labels == NAMESPACE_LABELS
    for rule in policy["spec"].get("ingress", []):
        if not any(p.get("port") == port for p in rule.get("ports", [])):
            continue
        for peer in rule.get("from", []):
            ns_ok = matches(peer["namespaceSelector"], namespace_labels) \
                if "namespaceSelector" in peer else same_namespace
            pod_ok = matches(peer["podSelector"], pod_labels) if "podSelector" in peer else True
            if ns_ok and pod_ok:
                return True
    return False


def pod_labels(r: chart.Rendered, component: str) -> dict[str, str]:
    found = r.one("Deployment" if component != "migrate" else "Job", f"-{component}")
    labels: dict[str, str] = found["spec"]["template"]["metadata"]["labels"]
    return labels


def test_network_policy_is_on_by_default_and_workers_cannot_reach_the_api(minimal_values):
    r = render(minimal_values)
    policies = {p["metadata"]["name"].rsplit("-", 1)[-1]: p for p in r.of_kind("NetworkPolicy")}
    assert set(policies) == {"worker", "orchestrator", "jobs"}
    api = policies["orchestrator"]
    port = r.one("Deployment", "-orchestrator")["spec"]["template"]["spec"]["containers"][0][
        "ports"][0]["containerPort"]
    assert not admitted(api, port, pod_labels(r, "worker"), NAMESPACE_LABELS)
    assert not admitted(api, port, pod_labels(r, "orchestrator"), NAMESPACE_LABELS)
    assert not admitted(api, port, {"app": "anything"}, NAMESPACE_LABELS)
    assert admitted(api, port, {"phasegate.dev/api-client": "true"}, NAMESPACE_LABELS)
    assert not admitted(api, port, {"phasegate.dev/api-client": "true"}, {"x": "elsewhere"})
    assert admitted(api, port, {"app": "prometheus"}, MONITORING)  # /metrics is on this port
    worker = policies["worker"]
    assert admitted(worker, 9100, {"app": "prometheus"}, MONITORING)
    assert not admitted(worker, 9100, pod_labels(r, "orchestrator"), NAMESPACE_LABELS)
    assert not any(admitted(worker, p, {"phasegate.dev/api-client": "true"}, NAMESPACE_LABELS)
                   for p in (80, 8080, 9100))
    jobs = policies["jobs"]
    assert jobs["spec"]["ingress"] == []
    (selects,) = jobs["spec"]["podSelector"]["matchExpressions"]
    assert selects["values"] == ["migrate", "upgrade-gate"]
    assert pod_labels(r, "migrate")["app.kubernetes.io/component"] in selects["values"]
    for name, policy in policies.items():
        assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
        ports = {(p["protocol"], p["port"]) for rule in policy["spec"]["egress"]
                 for p in rule["ports"]}
        allowed = {("UDP", 53), ("TCP", 53), ("TCP", 5432)} | (
            set() if name == "jobs" else {("TCP", 443)})
        assert ports == allowed, name


def test_clients_from_other_namespaces_and_narrow_egress(minimal_values):
    r = render(minimal_values, {"networkPolicy": {
        "apiClientNamespaceLabels": {"team": "ops"},
        "egress": {"postgresCidrs": ["10.0.8.0/24"], "httpsCidrs": ["10.0.0.0/16"],
                   "extraPorts": [6443]}}})
    api = r.one("NetworkPolicy", "-orchestrator")
    client = {"phasegate.dev/api-client": "true"}
    assert admitted(api, 8080, client, {"team": "ops"})
    assert not admitted(api, 8080, {"app": "x"}, {"team": "ops"})
    egress = r.one("NetworkPolicy", "-worker")["spec"]["egress"]
    postgres = next(rule for rule in egress if rule["ports"][0]["port"] == 5432)
    assert postgres["to"] == [{"ipBlock": {"cidr": "10.0.8.0/24"}}]
    https = next(rule for rule in egress if rule["ports"][0]["port"] == 443)
    assert [p["port"] for p in https["ports"]] == [443, 6443]


def test_network_policy_can_be_turned_off(minimal_values):
    assert render(minimal_values, {"networkPolicy": {"enabled": False}}).of_kind(
        "NetworkPolicy") == []


def test_each_process_gets_only_its_own_dsn(minimal_values):
    r = render(minimal_values, URLS)
    keys = {}
    for name, pod in r.pod_specs():
        (ref,) = [e["valueFrom"]["secretKeyRef"] for e in pod["containers"][0]["env"]
                  if e["name"] == "PHASEGATE_DATABASE_URL"]
        keys[name.rsplit("-", 1)[-1]] = (ref["name"].endswith("-migrate-database"), ref["key"])
    assert keys == {"worker": (False, "worker"), "orchestrator": (False, "orchestrator"),
                    "migrate": (True, "migrate")}
    secrets = {s["metadata"]["name"]: s for s in r.of_kind("Secret")}
    app = secrets["pg-phasegate-database"]["stringData"]
    # The schema owner's DSN is only in the migration hook's Secret, deleted after the hook.
    assert app == {"worker": "postgresql://wk:pw@db:5432/pg",
                   "orchestrator": "postgresql://orch:pw@db:5432/pg"}
    hook = secrets["pg-phasegate-migrate-database"]
    assert hook["stringData"] == {"migrate": "postgresql://owner:pw@db:5432/pg"}
    assert "hook-succeeded" in hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"]


@pytest.mark.parametrize(("override", "message"), [
    ({"database": {"urls": {"migrate": "", "orchestrator": ""}}}, "needs all three"),
    ({"database": {"url": "postgresql://x@db/pg"}}, "set only one of database.url"),
    ({"api": {"tokens": {"lines": []}}}, "api.tokens.lines"),
    ({"api": {"tokens": {"existingSecret": "t"}}}, "set only one of api.tokens"),
    ({"api": {"auth": "kubernetes"}}, "api.serviceAccounts"),
    ({"worker": {"podLabels": {"phasegate.dev/api-client": "true"}}}, "worker pods run"),
    ({"commonLabels": {"phasegate.dev/api-client": "true"}}, "workers included"),
])
def test_unsafe_combinations_fail(minimal_values, override, message):
    with pytest.raises(chart.RenderError, match=message):
        chart.render(chart.merge_values(chart.merge_values(minimal_values, URLS), override))


def test_an_open_api_cannot_be_configured(minimal_values):
    with pytest.raises(chart.RenderError):
        chart.render(chart.merge_values(minimal_values, {"api": {"auth": "none"}}))


def test_tokens_secret_from_values_mounted_read_only(minimal_values):
    r = render(minimal_values)
    secret = r.one("Secret", "-api-tokens")
    assert secret["stringData"]["tokens"].splitlines() == minimal_values["api"]["tokens"]["lines"]
    pod = r.one("Deployment", "-orchestrator")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PHASEGATE_API_AUTH"] == "tokens"
    assert env["PHASEGATE_API_TOKENS_FILE"] == "/etc/phasegate/api/tokens"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "api-tokens"]
    assert mount["readOnly"] is True and "subPath" not in mount  # subPath would not update
    (volume,) = [v for v in pod["volumes"] if v["name"] == "api-tokens"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert volume["secret"]["defaultMode"] == 0o440
    for name, other in r.pod_specs():  # only the orchestrator sees the tokens
        if not name.endswith("-orchestrator"):
            assert "api-tokens" not in str(other)


def test_existing_tokens_secret(minimal_values):
    r = render(minimal_values, {"api": {"tokens": {"lines": [], "existingSecret": "vault-tk",
                                                   "key": "lines"}}})
    assert not [s for s in r.of_kind("Secret") if "api-tokens" in s["metadata"]["name"]]
    pod = r.one("Deployment", "-orchestrator")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "api-tokens"]
    assert volume["secret"]["secretName"] == "vault-tk"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["PHASEGATE_API_TOKENS_FILE"] == "/etc/phasegate/api/lines"


def test_kubernetes_auth_may_review_tokens_and_nothing_else(minimal_values):
    r = render(minimal_values, {"api": {"auth": "kubernetes", "tokens": {"lines": []},
                                        "serviceAccounts": {"ci:deployer": ["operator"]}},
                                "orchestrator": {"fleetView": {"enabled": False}}})
    binding = r.one("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "system:auth-delegator"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pg-phasegate-orchestrator",
                                    "namespace": chart.NAMESPACE}]
    pod = r.one("Deployment", "-orchestrator")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True  # the TokenReview needs its token
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["PHASEGATE_API_AUTH"] == "kubernetes"
    assert env["PHASEGATE_API_SERVICE_ACCOUNTS"] == '{"ci:deployer":["operator"]}'
    assert "PHASEGATE_API_TOKENS_FILE" not in env
    assert not [v for v in pod["volumes"] if v["name"] == "api-tokens"]
    assert render(minimal_values).of_kind("ClusterRoleBinding") == []
