"""The orchestrator's fleet view in the chart: a Role that grants exactly the fleet view's two
API calls, bound to the orchestrator's ServiceAccount, its API token mounted on the
orchestrator pod only, and the variables that tell it which Deployment to read.

The guarantee is tested, not just the shape: ``FleetView`` runs through the real
``kubernetes`` client against a local apiserver that authorizes every request with the
rendered Role and RoleBinding, as the RBAC authorizer does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.deploy import chart
from tests.deploy.validate import validate_object
from tests.json_server import JsonServer

SCENARIOS = [p.name.removesuffix("-values.yaml") for p in chart.scenarios()]
DISABLED = {"orchestrator": {"fleetView": {"enabled": False}}}
TOKEN = "orchestrator-token"  # what the automounted token file holds, in the fake
# /api/v1/namespaces/NS/RESOURCE[/NAME] and /apis/GROUP/VERSION/namespaces/NS/RESOURCE[/NAME]
API_PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)/namespaces/(?P<namespace>[^/]+)"
                      r"/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?$")


def orchestrator_pod(r: chart.Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = r.one("Deployment", "-orchestrator")["spec"]["template"]["spec"]
    return spec


def fleet_env(r: chart.Rendered) -> dict[str, dict[str, Any]]:
    (container,) = orchestrator_pod(r)["containers"]
    return {e["name"]: e for e in container["env"] if e["name"].startswith("PHASEGATE_FLEET_")}


def service_account_user(r: chart.Rendered) -> str:
    return f"system:serviceaccount:{chart.NAMESPACE}:{orchestrator_pod(r)['serviceAccountName']}"


def authorize(r: chart.Rendered, user: str, verb: str, group: str, resource: str,
              namespace: str, name: str | None = None) -> bool:
    """The RBAC authorizer's decision over the rendered Roles and RoleBindings (all in the
    release namespace; a ServiceAccount subject without a namespace means the binding's)."""
    if namespace != chart.NAMESPACE:
        return False
    roles = {o["metadata"]["name"]: o for o in r.of_kind("Role")}
    for binding in r.of_kind("RoleBinding"):
        subjects = {f"system:serviceaccount:{s.get('namespace', chart.NAMESPACE)}:{s['name']}"
                    for s in binding["subjects"] if s["kind"] == "ServiceAccount"}
        if user not in subjects or binding["roleRef"]["kind"] != "Role":
            continue
        for rule in roles[binding["roleRef"]["name"]]["rules"]:
            if (group in rule["apiGroups"] and resource in rule["resources"]
                    and verb in rule["verbs"]
                    and (not rule.get("resourceNames") or name in rule["resourceNames"])):
                return True
    return False


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_role_grants_exactly_the_fleet_views_two_calls(scenario, rendered):
    r = rendered[scenario]
    worker = r.one("Deployment", "-worker")["metadata"]["name"]
    role = r.one("Role", "-orchestrator-fleet")
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": [worker],
         "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    assert not r.of_kind("ClusterRole") and not r.of_kind("ClusterRoleBinding")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rolebinding_grants_it_to_the_orchestrators_service_account(scenario, rendered):
    r = rendered[scenario]
    binding = r.one("RoleBinding", "-orchestrator-fleet")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": r.one("Role", "-orchestrator-fleet")["metadata"]["name"]}
    account = r.one("ServiceAccount", "-orchestrator")["metadata"]["name"]
    assert orchestrator_pod(r)["serviceAccountName"] == account
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": chart.NAMESPACE}]


@pytest.mark.parametrize(
    ("verb", "group", "resource", "name", "namespace"),
    [
        ("get", "apps", "deployments", "-orchestrator", chart.NAMESPACE),  # another Deployment
        ("list", "apps", "deployments", None, chart.NAMESPACE),
        ("watch", "", "pods", None, chart.NAMESPACE),
        ("delete", "", "pods", "some-pod", chart.NAMESPACE),
        ("get", "", "secrets", "pg-phasegate-database", chart.NAMESPACE),
        ("patch", "apps", "deployments", "-worker", chart.NAMESPACE),
        ("get", "apps", "deployments", "-worker", "other-namespace"),
        ("list", "", "pods", None, "other-namespace"),
    ],
)
def test_role_denies_everything_else(verb, group, resource, name, namespace, rendered):
    r = rendered["default"]
    if name and name.startswith("-"):
        name = r.one("Deployment", name)["metadata"]["name"]
    user = service_account_user(r)
    assert not authorize(r, user, verb, group, resource, namespace, name)
    # ...while the two calls themselves are allowed, and only to the orchestrator.
    worker = r.one("Deployment", "-worker")["metadata"]["name"]
    assert authorize(r, user, "get", "apps", "deployments", chart.NAMESPACE, worker)
    assert authorize(r, user, "list", "", "pods", chart.NAMESPACE)
    worker_account = r.one("Deployment", "-worker")["spec"]["template"]["spec"][
        "serviceAccountName"]
    worker_user = f"system:serviceaccount:{chart.NAMESPACE}:{worker_account}"
    assert not authorize(r, worker_user, "list", "", "pods", chart.NAMESPACE)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_token_mounted_on_the_orchestrator_only(scenario, rendered):
    r = rendered[scenario]
    mounted = {name.rsplit("-", 1)[-1]: pod["automountServiceAccountToken"]
               for name, pod in r.pod_specs()}
    assert mounted == {"orchestrator": True, "worker": False, "migrate": False}
    # The ServiceAccounts keep it off: only a pod that asks for the token gets it.
    assert {sa["automountServiceAccountToken"] for sa in r.of_kind("ServiceAccount")} == {False}
    # The in-cluster config reads the token where the kubelet mounts it; nothing shadows it.
    from kubernetes.config import incluster_config

    token_file = incluster_config.SERVICE_TOKEN_FILENAME
    assert token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    (container,) = orchestrator_pod(r)["containers"]
    assert not [m for m in container["volumeMounts"]
                if m["mountPath"].startswith("/var/run/secrets")]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fleet_variables_name_the_rendered_worker_deployment(scenario, rendered):
    from phasegate.cli_control import orchestrator as orchestrator_command

    r = rendered[scenario]
    env = fleet_env(r)
    assert env["PHASEGATE_FLEET_DEPLOYMENT"]["value"] == r.one("Deployment", "-worker")[
        "metadata"]["name"]
    assert env["PHASEGATE_FLEET_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}}
    # The names are the ones `phasegate orchestrator` reads.
    read = {p.name: p.envvar for p in orchestrator_command.params}
    assert set(env) == {read["fleet_deployment"], read["fleet_namespace"]}


def test_fleet_variables_follow_the_release_name(minimal_values, helm_home):
    r = chart.render(chart.merge_values(minimal_values, {"fullnameOverride": "acme"}),
                     release="other")
    assert fleet_env(r)["PHASEGATE_FLEET_DEPLOYMENT"]["value"] == "acme-worker"
    assert r.one("Role", "-orchestrator-fleet")["rules"][0]["resourceNames"] == ["acme-worker"]
    assert r.one("Deployment", "-worker")["metadata"]["name"] == "acme-worker"


def test_disabled_means_no_rbac_and_no_token(minimal_values, helm_home):
    r = chart.render(chart.merge_values(minimal_values, DISABLED))
    assert not r.of_kind("Role") and not r.of_kind("RoleBinding")
    assert {pod["automountServiceAccountToken"] for _, pod in r.pod_specs()} == {False}
    for obj in r.objects:
        validate_object(obj)


def test_a_named_existing_service_account_is_bound(minimal_values, helm_home):
    r = chart.render(chart.merge_values(minimal_values, {"serviceAccounts": {"orchestrator": {
        "create": False, "name": "platform-orchestrator", "roleArn": ""}}}))
    assert orchestrator_pod(r)["serviceAccountName"] == "platform-orchestrator"
    (subject,) = r.one("RoleBinding", "-orchestrator-fleet")["subjects"]
    assert subject["name"] == "platform-orchestrator"
    for obj in r.objects:
        validate_object(obj)


def test_binding_the_default_service_account_fails_with_a_clear_message(minimal_values,
                                                                         helm_home):
    no_account = {"serviceAccounts": {"orchestrator": {"create": False, "name": "",
                                                       "roleArn": ""}}}
    with pytest.raises(chart.RenderError, match=re.escape(
            "orchestrator.fleetView.enabled binds a Role to the orchestrator's ServiceAccount")):
        chart.render(chart.merge_values(minimal_values, no_account))
    r = chart.render(chart.merge_values(chart.merge_values(minimal_values, no_account), DISABLED))
    assert orchestrator_pod(r)["serviceAccountName"] == "default"
    assert not r.of_kind("RoleBinding")


class AuthorizingApiServer(JsonServer):
    """Serves the worker Deployment and its pods, authorizing each request with the rendered
    Role and RoleBinding for the identity the bearer token stands for."""

    def __init__(self, r: chart.Rendered, deployment: dict[str, Any],
                 pods: list[dict[str, Any]]) -> None:
        self.denied: list[str] = []
        self._rendered = r
        self._deployment = deployment
        self._pods = pods
        self._identities = {f"Bearer {TOKEN}": service_account_user(r)}
        super().__init__(self.respond)

    def respond(self, path: str, headers: Any) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(path)
        match = API_PATH.match(parts.path)
        user = self._identities.get(headers.get("Authorization", ""), "system:anonymous")
        if match is None:
            return 404, {"kind": "Status", "code": 404}
        verb = "get" if match["name"] else "list"
        if not authorize(self._rendered, user, verb, match["group"] or "", match["resource"],
                         match["namespace"], match["name"]):
            self.denied.append(f"{user} {verb} {parts.path}")
            return 403, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "reason": "Forbidden", "code": 403}
        if match["resource"] == "deployments":
            if match["name"] != self._deployment["metadata"]["name"]:
                return 404, {"kind": "Status", "code": 404}
            return 200, self._deployment
        return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": self._pods}


@pytest.fixture
def apiserver(rendered) -> Iterator[tuple[chart.Rendered, AuthorizingApiServer]]:
    r = rendered["default"]
    deployment = r.one("Deployment", "-worker")
    deployment = {**deployment, "metadata": {**deployment["metadata"],
                                             "namespace": chart.NAMESPACE},
                  "status": {"replicas": 2, "readyReplicas": 1, "availableReplicas": 1,
                             "updatedReplicas": 2}}
    pod = {"metadata": {"name": "w-1"}, "spec": deployment["spec"]["template"]["spec"],
           "status": {"phase": "Failed", "reason": "Evicted",
                      "startTime": "2026-11-29T09:00:00Z"}}
    with AuthorizingApiServer(r, deployment, [pod]) as server:
        yield r, server


async def test_the_fleet_view_reads_the_fleet_with_the_rendered_rbac(apiserver):
    from phasegate.orchestrator.fleet import FleetView

    r, server = apiserver
    env = fleet_env(r)
    view = FleetView.for_host(server.url, namespace=chart.NAMESPACE,  # metadata.namespace
                              deployment=env["PHASEGATE_FLEET_DEPLOYMENT"]["value"],
                              token=TOKEN)
    try:
        fleet = await view.snapshot()
    finally:
        view.close()
    assert server.denied == []
    assert fleet.message is None
    # No spec.replicas: the HPA owns the worker count in the default scenario.
    assert (fleet.desired_replicas, fleet.ready_replicas, fleet.pods) == (None, 1, 1)
    assert [t.reason for t in fleet.terminations] == ["Evicted"]


async def test_without_the_token_the_fleet_view_is_forbidden_and_says_so(apiserver):
    from phasegate.orchestrator.fleet import FleetView

    r, server = apiserver
    view = FleetView.for_host(server.url, namespace=chart.NAMESPACE,
                              deployment=fleet_env(r)["PHASEGATE_FLEET_DEPLOYMENT"]["value"])
    try:
        fleet = await view.snapshot()
    finally:
        view.close()
    assert fleet.message == "cannot read the fleet: HTTP 403 Forbidden"
    assert server.denied
