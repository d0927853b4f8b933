"""Turn a rendered pod spec into `docker run` flags, so a container runs as the pod would.

What maps: the container's user and group, the read-only root filesystem, dropped
capabilities, no privilege escalation, emptyDir mounts as size-limited tmpfs, the memory limit,
the args, and the environment (the ConfigMap behind ``envFrom``, literal values, Secret keys
the chart renders, and the downward-API fields the chart uses). Anything the chart renders
that this cannot map fails loudly instead of being dropped.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

from tests.deploy.chart import NAMESPACE, Rendered

_QUANTITY = re.compile(r"^(\d+)(Ki|Mi|Gi)?$")
_FACTORS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def quantity_bytes(value: str | int) -> int:
    match = _QUANTITY.match(str(value))
    if match is None:
        raise ValueError(f"unsupported memory quantity {value!r}")
    return int(match[1]) * _FACTORS[match[2]]


@dataclass
class PodRun:
    """One container of a rendered workload, as docker flags plus what the test needs."""

    name: str
    args: list[str]
    env: dict[str, str]
    flags: list[str] = field(default_factory=list)
    memory_limit: int | None = None
    grace_seconds: int = 30

    def docker_args(self, image: str, *, env: dict[str, str] | None = None,
                    memory: int | None = None, extra: list[str] | None = None) -> list[str]:
        merged = {**self.env, **(env or {})}
        limit = memory if memory is not None else self.memory_limit
        out = ["--network", "host", *self.flags]
        if limit is not None:
            # No swap: the limit is the pod's limit, as on a node without swap.
            out += ["--memory", str(limit), "--memory-swap", str(limit)]
        for key in sorted(merged):
            out += ["--env", f"{key}={merged[key]}"]
        return [*out, *(extra or []), image, *self.args]


def _config_maps(rendered: Rendered) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o.get("data", {}) for o in rendered.of_kind("ConfigMap")}


def _secrets(rendered: Rendered) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for secret in rendered.of_kind("Secret"):
        data = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
        data.update(secret.get("stringData", {}))
        out[secret["metadata"]["name"]] = data
    return out


def _env(rendered: Rendered, container: dict[str, Any], pod_name: str) -> dict[str, str]:
    config_maps, secrets = _config_maps(rendered), _secrets(rendered)
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]])
    fields = {"metadata.name": pod_name, "metadata.namespace": NAMESPACE}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = item["valueFrom"]
        if "secretKeyRef" in ref:
            env[item["name"]] = secrets[ref["secretKeyRef"]["name"]][ref["secretKeyRef"]["key"]]
        elif "fieldRef" in ref:
            env[item["name"]] = fields[ref["fieldRef"]["fieldPath"]]
        else:
            raise ValueError(f"cannot map env {item['name']}: {ref}")
    return env


def _security_flags(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    sc = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    flags = ["--user", f"{sc['runAsUser']}:{sc['runAsGroup']}"]
    if sc.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    for capability in sc.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", capability]
    if sc.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if sc.get("privileged"):
        raise ValueError("the chart must never render a privileged container")
    return flags


def _volume_flags(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    flags: list[str] = []
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" not in volume:
            raise ValueError(f"cannot map volume {mount['name']}: {volume}")
        size = volume["emptyDir"].get("sizeLimit")
        options = f"size={quantity_bytes(size)}" if size else ""
        flags += ["--tmpfs", f"{mount['mountPath']}:{options}" if options else mount["mountPath"]]
    return flags


def pod_run(rendered: Rendered, kind: str, name_suffix: str, pod_name: str) -> PodRun:
    """The first container of workload ``kind`` named ``*name_suffix``."""
    workload = rendered.one(kind, name_suffix)
    pod = workload["spec"]["template"]["spec"]
    container = pod["containers"][0]
    limit = container.get("resources", {}).get("limits", {}).get("memory")
    return PodRun(
        name=pod_name, args=list(container.get("args", [])),
        env=_env(rendered, container, pod_name),
        flags=_security_flags(pod, container) + _volume_flags(pod, container),
        memory_limit=quantity_bytes(limit) if limit else None,
        grace_seconds=int(pod.get("terminationGracePeriodSeconds", 30)))
