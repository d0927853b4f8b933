"""``metrics.child``: the registered child of a label set, looked up once."""

from __future__ import annotations

from prometheus_client import REGISTRY

from phasegate import metrics


def test_a_remembered_child_is_the_registered_one_and_counts_there() -> None:
    labels = ("unit-test-flow", "unit-test-phase", "advanced")
    first = metrics.child(metrics.PHASE_DURATION, *labels)
    assert metrics.child(metrics.PHASE_DURATION, *labels) is first
    assert first is metrics.PHASE_DURATION.labels(*labels)
    assert metrics.child(metrics.MESSAGES, "advanced") is not metrics.child(
        metrics.MESSAGES, "deleted")
    name = dict(zip(("workflow", "phase", "outcome"), labels, strict=True))
    before = REGISTRY.get_sample_value("phasegate_phase_duration_seconds_count", name) or 0.0
    metrics.child(metrics.PHASE_DURATION, *labels).observe(0.5)
    assert REGISTRY.get_sample_value("phasegate_phase_duration_seconds_count", name) \
        == before + 1
