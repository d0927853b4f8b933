"""Render and lint the chart with the real Helm engine.

A `helm` binary on PATH is used when present; otherwise the engine bundled in the
`helm-python-sdk` package (Helm v4's Go code as a shared library) renders offline.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "phasegate"
SCENARIO_DIR = CHART_DIR / "ci"
KUBE_VERSION = "1.37.0"
RELEASE = "pg"
NAMESPACE = "jobs"


class RenderError(Exception):
    """The chart refused to render; the message is Helm's."""


@dataclass(frozen=True)
class Rendered:
    """The objects of one render, with lookups the tests use."""

    objects: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"].endswith(name_suffix)]
        assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
        return found[0]

    def pod_specs(self) -> list[tuple[str, dict[str, Any]]]:
        """(object name, pod spec) of every workload that runs pods."""
        return [
            (o["metadata"]["name"], o["spec"]["template"]["spec"])
            for o in self.objects
            if o["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}
        ]


def scenarios() -> list[Path]:
    return sorted(SCENARIO_DIR.glob("*-values.yaml"))


def load_values(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def _parse(stream: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(stream) if doc]


# What a cluster with KEDA installed serves (``helm template --api-versions``).
KEDA_API_VERSIONS = ("keda.sh/v1alpha1", "keda.sh/v1alpha1/ScaledObject",
                     "keda.sh/v1alpha1/TriggerAuthentication",
                     "keda.sh/v1alpha1/ClusterTriggerAuthentication")


def render(
    values: dict[str, Any], chart_dir: Path = CHART_DIR, release: str = RELEASE,
    api_versions: tuple[str, ...] = (), is_upgrade: bool = False,
) -> Rendered:
    """Render as ``helm template`` would; ``api_versions`` are the extra APIs the cluster
    serves (``.Capabilities.APIVersions``), e.g. ``KEDA_API_VERSIONS``."""
    helm = shutil.which("helm")
    if helm:
        return _render_with_binary(helm, values, chart_dir, release, api_versions, is_upgrade)
    import helm_python
    from helm_python import _native

    # Chart.render() does not expose the engine's api_versions/kube_version options; the
    # bundled engine takes them in the same options document.
    opts = {"name": release, "namespace": NAMESPACE, "is_install": not is_upgrade,
            "is_upgrade": is_upgrade, "kube_version": f"v{KUBE_VERSION}",
            "api_versions": list(api_versions)}
    try:
        with helm_python.Chart.load(chart_dir) as chart:
            chart.validate_schema(values)
            files: dict[str, str] = json.loads(_native.call_string(
                "helm_render", chart._raw(), json.dumps(values), json.dumps(opts)))
    except (helm_python.HelmRenderError, helm_python.HelmValuesError) as exc:
        raise RenderError(str(exc)) from exc
    objects: list[dict[str, Any]] = []
    notes = ""
    for path in sorted(files):
        if path.endswith("NOTES.txt"):
            notes = files[path]
        elif path.endswith((".yaml", ".yml")):
            objects.extend(_parse(files[path]))
    return Rendered(objects, notes)


def _render_with_binary(
    helm: str, values: dict[str, Any], chart_dir: Path, release: str,
    api_versions: tuple[str, ...], is_upgrade: bool,
) -> Rendered:
    extra = [arg for version in api_versions for arg in ("--api-versions", version)]
    if is_upgrade:
        extra.append("--is-upgrade")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as fh:
        yaml.safe_dump(values, fh)
        fh.flush()
        proc = subprocess.run(
            [helm, "template", release, str(chart_dir), "--namespace", NAMESPACE,
             "--kube-version", KUBE_VERSION, "--values", fh.name, *extra],
            capture_output=True, text=True, check=False,
        )
    if proc.returncode != 0:
        raise RenderError(proc.stderr)
    return Rendered(_parse(proc.stdout), notes="")


def lint(values: dict[str, Any], chart_dir: Path = CHART_DIR) -> list[str]:
    """Lint findings of severity warning or worse (strict lint fails on these)."""
    helm = shutil.which("helm")
    if helm:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as fh:
            yaml.safe_dump(values, fh)
            fh.flush()
            proc = subprocess.run(
                [helm, "lint", "--strict", str(chart_dir), "--values", fh.name],
                capture_output=True, text=True, check=False,
            )
        return [] if proc.returncode == 0 else [proc.stdout + proc.stderr]
    import helm_python

    report = helm_python.lint(chart_dir, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    warning = 2
    problems = [f"{m['path']}: {m['error']}" for m in report["messages"]
                if m["severity"] >= warning]
    return problems + list(report.get("errors", []))


def merge_values(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base`` (maps merge, everything else replaces)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = value
    return merged
