"""Scale to zero, simulated: the rendered HPA spec driven by queue-depth traces through the
HPA controller's algorithm (tests/deploy/hpa.py) and a model fleet (tests/deploy/fleet.py)."""

from __future__ import annotations

import itertools
import math

import pytest

from tests.deploy import chart
from tests.deploy.fleet import Fleet
from tests.deploy.hpa import (
    HorizontalPodAutoscaler,
    HpaSpec,
    Policy,
    Rules,
    external_average_value_replicas,
)


@pytest.fixture(scope="module")
def scale_to_zero(helm_home) -> chart.Rendered:
    """The default scenario on a cluster with the HPAScaleToZero gate (scaleToZero: true)."""
    values = chart.merge_values(chart.load_values(chart.SCENARIO_DIR / "default-values.yaml"),
                                {"autoscaling": {"hpa": {"scaleToZero": True}}})
    return chart.render(values)


@pytest.fixture
def spec(scale_to_zero) -> HpaSpec:
    hpa = scale_to_zero.one("HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == 0
    return HpaSpec.from_manifest(hpa)


@pytest.fixture
def fleet(scale_to_zero, spec) -> Fleet:
    config = scale_to_zero.one("ConfigMap", "-config")["data"]
    fleet = Fleet(hpa=HorizontalPodAutoscaler(spec),
                  concurrency=int(config["PHASEGATE_CONCURRENCY"]),
                  shutdown_grace_s=float(config["PHASEGATE_SHUTDOWN_GRACE_S"]))
    return fleet


def nothing(_t: int) -> list[int]:
    return []


# -- the algorithm itself, against hand-computed values


def test_zero_replicas_wake_on_any_load_and_stay_down_on_none():
    assert external_average_value_replicas(0, 0, 8, 0.1, 0.1) == 0
    assert external_average_value_replicas(0, 1, 8, 0.1, 0.1) == 1
    assert external_average_value_replicas(0, 17, 8, 0.1, 0.1) == 3


def test_tolerance_band_keeps_the_replica_count():
    assert external_average_value_replicas(10, 85, 8, 0.1, 0.1) == 10  # ratio 1.06
    assert external_average_value_replicas(10, 89, 8, 0.1, 0.1) == 12  # ratio 1.11
    assert external_average_value_replicas(10, 72, 8, 0.1, 0.1) == 10  # ratio 0.90
    assert external_average_value_replicas(10, 71, 8, 0.1, 0.1) == 9


def test_scale_up_policies_limit_each_period():
    spec = HpaSpec(0, 100, 1.0, Rules(0, "Max", (Policy("Pods", 4, 15),
                                                 Policy("Percent", 100, 15))),
                   Rules(300, "Max", (Policy("Percent", 50, 60),)))
    hpa = HorizontalPodAutoscaler(spec)
    assert hpa.reconcile(0, 0, 0, 1000) == 4  # from 0: max(0+4, ceil(0*2)) = 4
    assert hpa.reconcile(15, 4, 4, 1000) == 8  # max(4+4, 4*2)
    assert hpa.reconcile(30, 8, 8, 1000) == 16  # 100% wins now
    assert hpa.reconcile(31, 16, 16, 1000) == 16  # same period: nothing more allowed


def test_scale_down_waits_for_the_window_then_follows_the_policy():
    spec = HpaSpec(0, 100, 1.0, Rules(0, "Max", (Policy("Pods", 100, 15),)),
                   Rules(300, "Max", (Policy("Percent", 50, 60),)))
    hpa = HorizontalPodAutoscaler(spec)
    assert hpa.reconcile(0, 0, 0, 10) == 10
    assert hpa.reconcile(15, 10, 10, 0) == 10  # 10 was recommended within 300 s
    assert hpa.reconcile(299, 10, 10, 0) == 10
    assert hpa.reconcile(315, 10, 10, 0) == 5  # window passed; 50% per 60 s
    assert hpa.reconcile(330, 5, 5, 0) == 5  # same 60 s period
    assert hpa.reconcile(376, 5, 5, 0) == 2  # int(5 * 0.5)
    assert hpa.reconcile(437, 2, 2, 0) == 1
    assert hpa.reconcile(498, 1, 1, 0) == 0  # int(1 * 0.5) = 0: scale to zero


# -- traces through the rendered HPA


def test_burst_from_empty(fleet, spec):
    fleet.redo_s = 60
    fleet.run(600, nothing)
    assert {s.replicas for s in fleet.history} == {0}, "an idle fleet stays at zero"

    fleet.run(1, lambda _t: [60], start=600)  # the first message
    fleet.run(200, nothing, start=601)
    woke = next(s.t for s in fleet.history if s.replicas > 0)
    assert woke - 600 <= fleet.scrape_s + fleet.sync_s, "the first message wakes a worker"

    burst = 2 * spec.max_replicas * fleet.concurrency  # twice what the fleet holds at once
    fleet.run(1, lambda _t: [60] * burst, start=801)
    fleet.run(900, nothing, start=802)
    peak = max(s.replicas for s in fleet.history)
    assert peak == spec.max_replicas
    _assert_scale_up_within_policy(fleet, spec)
    assert fleet.completed == fleet.arrived == burst + 1


def test_steady_load_converges_without_flapping(fleet, spec):
    fleet.redo_s = 40
    per_second = 1  # 1 message/s x 40 s each = 40 in flight = 10 workers of 4
    fleet.run(3600, lambda t: [40] * per_second)
    settled = [s for s in fleet.history if s.t >= 900]
    replicas = {s.replicas for s in settled}
    expected = math.ceil(per_second * 40 / spec.target_average)
    assert min(replicas) >= expected and max(replicas) <= expected + 2, replicas
    # The target equals what a worker can hold, so no backlog builds up at equilibrium.
    assert max(s.visible for s in settled) <= per_second * fleet.concurrency
    changes = sum(1 for a, b in itertools.pairwise(settled)
                  if a.replicas != b.replicas)
    assert changes <= 4, f"{changes} replica changes under steady load"
    assert fleet.handed_back == 0


def test_drain_never_scales_to_zero_while_messages_are_in_flight(fleet, spec):
    long_phase = 1200  # 20-minute phases: the queue is empty long before they finish
    fleet.redo_s = long_phase
    fleet.run(1, lambda _t: [long_phase] * 24)
    fleet.run(3 * long_phase, nothing, start=1)
    for s in fleet.history:
        if s.inflight or s.visible:
            assert s.replicas > 0, f"scaled to zero at t={s.t} with work outstanding"
    assert fleet.history[-1].replicas == 0, "and it does reach zero once the work is done"
    assert fleet.completed == fleet.arrived == 24


def test_scale_down_respects_the_stabilization_window(fleet, spec):
    fleet.redo_s = 30
    fleet.run(900, lambda t: [30] * 2 if t < 600 else [])  # 60 in flight: 15 workers
    fleet.run(1500, nothing, start=900)
    window = spec.down.window_s
    history = fleet.history
    syncs = [s for s in history if s.t % fleet.sync_s == 0]
    for prev, cur in itertools.pairwise(history):
        if cur.replicas < prev.replicas:
            recent = [s for s in syncs if cur.t - window < s.t <= cur.t]
            demanded = max(s.observed for s in recent) / spec.target_average
            assert demanded <= cur.replicas * (1 + spec.down.tolerance), (
                f"scaled to {cur.replicas} at t={cur.t} though {demanded:.1f} workers "
                f"were demanded within the last {window}s")
    # Load stops at t=600; the HPA sees that up to one scrape plus one sync later, so the
    # first scale-down comes no sooner than the window after that.
    at_stop = _replicas_at(history, 600)
    first_drop = next(s.t for s in history if s.t > 600 and s.replicas < at_stop)
    assert first_drop >= 600 + window - fleet.scrape_s - fleet.sync_s
    assert history[-1].replicas == 0


def _replicas_at(history, t):
    return next(s.replicas for s in history if s.t == t)


def _assert_scale_up_within_policy(fleet, spec):
    period = min(p.period_s for p in spec.up.policies)
    for s in fleet.history:
        start = _replicas_at(fleet.history, max(0, s.t - period))
        allowed = max(
            start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100))
            for p in spec.up.policies)
        assert s.replicas <= max(allowed, start), f"scale-up too fast at t={s.t}"
