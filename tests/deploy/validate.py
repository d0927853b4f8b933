"""Validate rendered objects: built-in kinds against Kubernetes' own schemas, strict;
custom resources against the fields of their CRDs that phasegate uses (tests/deploy/schemas)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

from tests.deploy.chart import KUBE_VERSION

SCHEMA_DIR = Path(__file__).parent / "schemas"

# Custom resources the chart and manifests may render, mapped to a schema file. Each schema
# covers the CRD fields phasegate sets, with the CRD's types and enums, and rejects any
# field it does not know (a typo must fail here, not silently in the cluster).
CUSTOM_RESOURCES = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda-scaledobject.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda-triggerauthentication.json",
    ("keda.sh/v1alpha1", "ClusterTriggerAuthentication"): "keda-clustertriggerauthentication.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.json",
}


@cache
def _custom_schema(filename: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMA_DIR / filename).read_text())
    return schema


def validate_object(obj: dict[str, Any]) -> None:
    """Raise if ``obj`` does not validate; every kind must have a schema."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CUSTOM_RESOURCES:
        jsonschema.validate(obj, _custom_schema(CUSTOM_RESOURCES[key]))
        return
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
