"""Every scenario renders with the real Helm engine, lints clean and validates, object by object,
against Kubernetes 1.37 (strict) or the CRD fields of the custom resources it uses."""

from __future__ import annotations

import pytest

from tests.deploy import chart
from tests.deploy.validate import validate_object

SCENARIOS = [p.name.removesuffix("-values.yaml") for p in chart.scenarios()]


def test_the_issue_scenarios_exist():
    assert set(SCENARIOS) >= {"default", "keda", "fargate", "external-secret", "minimal"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_lints_clean(scenario, helm_home):
    values = chart.load_values(chart.SCENARIO_DIR / f"{scenario}-values.yaml")
    assert chart.lint(values) == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_validates(scenario, rendered):
    objects = rendered[scenario].objects
    assert objects, "rendered nothing"
    for obj in objects:
        validate_object(obj)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_object_names_are_unique(scenario, rendered):
    keys = [(o["kind"], o["metadata"]["name"]) for o in rendered[scenario].objects]
    assert len(keys) == len(set(keys))


def test_notes_name_the_autoscaler(rendered):
    notes = rendered["default"].notes
    if notes:  # `helm template` (binary) does not print NOTES.txt; the bundled engine does
        assert "phasegate_queue_messages" in notes
        assert "HPAScaleToZero" in notes


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"autoscaling": {"mode": "both"}}, "autoscaling[./]mode"),
        ({"worker": {"replicaz": 2}}, "replicaz"),
        ({"config": {"queueUrl": "sqs://nope"}}, "queueUrl"),
        ({"autoscaling": {"hpa": {"minReplicas": -1}}}, "minReplicas"),
        ({"database": {"url": "mysql://x"}}, "database[./]url"),
    ],
)
def test_schema_rejects_bad_values(override, message, minimal_values, helm_home):
    values = chart.merge_values(minimal_values, override)
    with pytest.raises(chart.RenderError, match=message):
        chart.render(values)

