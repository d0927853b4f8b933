"""The plain manifests in k8s/: every kustomization builds, every object validates, and each
stays equivalent to the chart rendered with the values it declares (k8s/**/chart-values.yaml)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import chart
from tests.deploy.validate import validate_object

K8S = chart.ROOT / "k8s"
KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed; `kubectl kustomize` builds the overlays")

KUSTOMIZATIONS = ["base", "migrate", "overlays/keda", "overlays/eks-fargate"]
# Labels and annotations only Helm adds (release bookkeeping, hook wiring, config checksums).
HELM_ONLY_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by"}
HELM_RELEASE = "phasegate"


def build(directory: str) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    proc = subprocess.run([KUBECTL, "kustomize", str(K8S / directory)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


# configMapGenerator appends a hash of the content to the name (and to every reference).
GENERATED_HASH = re.compile(r"^(phasegate-config)-[a-z0-9]{10}$")


def _unhash(name: str) -> str:
    return GENERATED_HASH.sub(r"\1", name)


def normalize(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    meta["name"] = _unhash(meta["name"])
    pod = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod.get("containers", []):
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                source["configMapRef"]["name"] = _unhash(source["configMapRef"]["name"])
    meta.pop("namespace", None)
    # The namespace is chosen at install time, for a binding's ServiceAccount subjects too
    # (test_rolebinding_subjects_follow_the_namespace checks what kustomize puts there).
    for subject in obj.get("subjects", []):
        if subject.get("kind") == "ServiceAccount":
            subject.pop("namespace", None)
    for label in HELM_ONLY_LABELS:
        meta.get("labels", {}).pop(label, None)
    annotations = {k: v for k, v in meta.get("annotations", {}).items()
                   if not k.startswith("helm.sh/")}
    meta.pop("annotations", None)
    if annotations:
        meta["annotations"] = annotations
    template = obj.get("spec", {}).get("template", {}).get("metadata", {})
    template.get("annotations", {}).pop("checksum/config", None)
    if "annotations" in template and not template["annotations"]:
        template.pop("annotations")
    return obj


def keyed(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    normalized = [normalize(o) for o in objects]
    return {(o["kind"], o["metadata"]["name"]): o for o in normalized}


def chart_equivalent(values_files: list[Path]) -> dict[tuple[str, str], dict[str, Any]]:
    values: dict[str, Any] = {}
    for path in values_files:
        values = chart.merge_values(values, chart.load_values(path))
    return keyed(chart.render(values, release=HELM_RELEASE).objects)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_kustomization_builds_and_validates(directory):
    objects = build(directory)
    assert objects
    for obj in objects:
        validate_object(obj)


@pytest.mark.parametrize("directory", ["overlays/keda", "overlays/eks-fargate"])
def test_overlay_has_one_autoscaler_and_a_namespace(directory):
    objects = build(directory)
    assert [o["kind"] for o in objects
            if o["kind"] in {"HorizontalPodAutoscaler", "ScaledObject"}] == ["ScaledObject"]
    assert {o["metadata"].get("namespace") for o in objects} == {"phasegate"}


def test_base_and_migrate_equal_the_chart(helm_home):
    expected = chart_equivalent([K8S / "chart-values.yaml"])
    actual = keyed(build("base") + build("migrate"))
    assert sorted(actual) == sorted(expected)
    for key, obj in expected.items():
        assert actual[key] == obj, f"{key} differs from the chart"


@pytest.mark.parametrize("overlay", ["overlays/keda", "overlays/eks-fargate"])
def test_overlay_equals_the_chart(overlay, helm_home):
    expected = chart_equivalent([K8S / "chart-values.yaml", K8S / overlay / "chart-values.yaml"])
    expected = {k: v for k, v in expected.items() if k[0] != "Job"}  # migrations: k8s/migrate
    actual = keyed(build(overlay))
    assert sorted(actual) == sorted(expected)
    for key, obj in expected.items():
        assert actual[key] == obj, f"{key} differs from the chart"


@pytest.mark.parametrize(("directory", "namespace"),
                         [("base", None), ("overlays/keda", "phasegate"),
                          ("overlays/eks-fargate", "phasegate")])
def test_rolebinding_subjects_follow_the_namespace(directory, namespace):
    """A ServiceAccount subject without a namespace means the binding's own (the base, applied
    with `kubectl -n`); an overlay's `namespace:` must rewrite it to its own, or the Role is
    granted to an account in another namespace."""
    objects = build(directory)
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    assert bindings
    for binding in bindings:
        assert binding["metadata"].get("namespace") == namespace
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["name"] in accounts
            assert subject.get("namespace") == namespace


def _config_ref(objects: list[dict[str, Any]], deployment: str) -> str:
    (obj,) = [o for o in objects if o["kind"] == "Deployment"
              and o["metadata"]["name"] == deployment]
    (source,) = obj["spec"]["template"]["spec"]["containers"][0]["envFrom"]
    name: str = source["configMapRef"]["name"]
    return name


def test_a_config_edit_renames_the_configmap_so_the_pods_roll(tmp_path):
    copy_of = tmp_path / "k8s"
    shutil.copytree(K8S, copy_of)
    before = build("base")
    env = copy_of / "base" / "config.env"
    env.write_text(env.read_text().replace("PHASEGATE_CONCURRENCY=4", "PHASEGATE_CONCURRENCY=8"))
    assert KUBECTL is not None
    proc = subprocess.run([KUBECTL, "kustomize", str(copy_of / "base")],
                          capture_output=True, text=True, check=True)
    after = [d for d in yaml.safe_load_all(proc.stdout) if d]
    for deployment in ("phasegate-worker", "phasegate-orchestrator"):
        old, new = _config_ref(before, deployment), _config_ref(after, deployment)
        assert GENERATED_HASH.match(old) and GENERATED_HASH.match(new)
        assert old != new, "the pod template changed, so the Deployment rolls"
    (cm,) = [o for o in after if o["kind"] == "ConfigMap"
             and GENERATED_HASH.match(o["metadata"]["name"])]
    assert cm["data"]["PHASEGATE_CONCURRENCY"] == "8"


def test_an_images_entry_sets_every_phasegate_container(tmp_path):
    shutil.copytree(K8S, tmp_path / "k8s")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../k8s/base", "../k8s/migrate"],
        "images": [{"name": "phasegate", "newName": "123456789012.dkr.ecr.eu-west-1"
                    ".amazonaws.com/phasegate", "newTag": "1.2.3"}]}))
    assert KUBECTL is not None
    proc = subprocess.run([KUBECTL, "kustomize", str(overlay)], capture_output=True, text=True,
                          check=True)
    images = [c["image"] for o in yaml.safe_load_all(proc.stdout) if o and "template" in o.get(
        "spec", {}) for c in o["spec"]["template"]["spec"]["containers"]]
    assert len(images) == 3
    assert set(images) == {"123456789012.dkr.ecr.eu-west-1.amazonaws.com/phasegate:1.2.3"}
