"""The capacity plan, simulated: a queue-depth trace that takes the fleet from 0 to 1,000 pods
and back, through the rendered chart's HPA (tests/deploy/hpa.py) and the model fleet
(tests/deploy/fleet.py), with every second's load computed by bench/capacity.py from the
measured per-transition costs. At the documented settings no quota or budget is exceeded.
With local continuation (the default) one phase in six goes through SQS, so even a FIFO queue
without high-throughput mode carries the trace; with continuation off the same trace breaks
its 300 calls/s quota."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench import capacity
from tests.deploy import chart
from tests.deploy.fleet import Fleet
from tests.deploy.hpa import HorizontalPodAutoscaler, HpaSpec

MAX_PODS = 1000
PHASE_S = 5  # the plan's typical phase
PEAK_RATE = 800  # new phase messages per second at the peak: 1,000 pods x 4 / 5 s
WINDOW_S = 5


@pytest.fixture(scope="module")
def at_scale(helm_home):
    """The default scenario with the fleet bound raised to 1,000 pods (pooler declared), on a
    cluster that scales to zero (HPAScaleToZero)."""
    values = chart.merge_values(chart.load_values(chart.SCENARIO_DIR / "default-values.yaml"),
                                {"autoscaling": {"maxReplicas": MAX_PODS,
                                                 "hpa": {"scaleToZero": True}}})
    return chart.render(values)


def settings_from(rendered) -> capacity.Settings:
    config = rendered.one("ConfigMap", "-config")["data"]
    orchestrator = rendered.one("Deployment", "-orchestrator")
    assert config["PHASEGATE_DATABASE_POOLER"] == "transaction"
    # The chart leaves local continuation at the worker's default: on.
    assert "PHASEGATE_CONTINUATION" not in config
    return capacity.Settings(
        concurrency=int(config["PHASEGATE_CONCURRENCY"]),
        pool_max=int(config["PHASEGATE_DB_POOL_MAX"]),
        phase_s=PHASE_S, heartbeat_s=float(config["PHASEGATE_HEARTBEAT_S"]),
        orchestrator_replicas=int(orchestrator["spec"]["replicas"]))


def phases(n: int) -> list[int]:
    """n phase messages of 3..7 s (mean PHASE_S): real phases differ, so completions spread."""
    return [PHASE_S - 2 + i % 5 for i in range(n)]


def trace(t: int) -> list[int]:
    """Idle, a 300 s ramp to the peak, 600 s at the peak, then nothing (scale back to 0)."""
    if t < 60:
        return []
    if t < 360:
        return phases(PEAK_RATE * (t - 60) // 300)
    if t < 960:
        return phases(PEAK_RATE)
    return []


Sample = tuple[int, float]  # pods, transitions/s


def simulate(rendered, settings: capacity.Settings) -> tuple[Fleet, list[Sample]]:
    spec = HpaSpec.from_manifest(rendered.one("HorizontalPodAutoscaler"))
    assert spec.max_replicas == MAX_PODS
    fleet = Fleet(hpa=HorizontalPodAutoscaler(spec), concurrency=settings.concurrency,
                  shutdown_grace_s=20, redo_s=PHASE_S)
    samples = []
    completed = [0] * WINDOW_S
    for t in range(2400):
        fleet.run(1, trace, start=t)
        completed.append(fleet.completed)
        # Transitions per second over the last few seconds: a fleet that woke at once
        # finishes its first phases in step; SQS and Postgres see a rate, not one instant.
        rate = (completed[-1] - completed[-1 - WINDOW_S]) / WINDOW_S
        samples.append((len(fleet.pods), rate))
    return fleet, samples


def loads(samples: list[Sample], settings: capacity.Settings) -> list[capacity.Load]:
    """Every second's load of the simulated fleet, at ``settings``."""
    return [capacity.load(pods, rate, settings) for pods, rate in samples]


@pytest.fixture(scope="module")
def simulated(at_scale):
    settings = settings_from(at_scale)
    fleet, samples = simulate(at_scale, settings)
    return settings, fleet, samples


@pytest.mark.parametrize("continuation", [True, False], ids=["continuation", "plain"])
def test_zero_to_a_thousand_pods_stays_within_every_budget(simulated, continuation):
    settings, fleet, samples = simulated
    settings = replace(settings, continuation=continuation)
    budgets = capacity.budgets_for(settings)
    every = loads(samples, settings)
    peak = {field: max(getattr(x, field) for x in every) for field in (
        "pods", "transitions_per_s", "client_connections", "server_connections",
        "commits_per_s", "wal_bytes_per_s", "receive_calls_per_s", "calls_per_s_per_group")}
    print(f"\ncapacity simulation peaks: {peak}")
    assert peak["pods"] == MAX_PODS, "the trace really reaches the fleet bound"
    assert peak["transitions_per_s"] >= PEAK_RATE * 0.95
    for second, x in enumerate(every):
        assert capacity.exceeded(x, budgets) == [], f"t={second}s: {x}"
    assert fleet.completed == fleet.arrived, "every message was worked off"
    assert fleet.history[-1].replicas == 0, "and the fleet scaled back to zero"


def test_the_plan_table_matches_the_model_at_its_own_settings(simulated):
    settings, _fleet, samples = simulated
    steady = max(loads(samples, settings), key=lambda x: x.transitions_per_s)
    planned = capacity.saturated(MAX_PODS, settings)
    assert planned.client_connections == MAX_PODS * settings.pool_max + 2 * 4
    # The simulated peak is the plan's saturated fleet, within the HPA's tolerance.
    assert steady.transitions_per_s == pytest.approx(planned.transitions_per_s, rel=0.1)
    assert capacity.exceeded(planned, capacity.budgets_for(settings)) == []


def test_without_continuation_or_high_throughput_fifo_the_trace_breaks_the_sqs_quota(
        simulated):
    settings, _fleet, samples = simulated
    plain = replace(settings, continuation=False, high_throughput_fifo=False)
    standard = capacity.budgets_for(plain)
    every = loads(samples, plain)
    over = [capacity.exceeded(x, standard) for x in every]
    assert any("SQS ReceiveMessage/s" in " ".join(o) for o in over)
    first = next(x for x, o in zip(every, over, strict=True) if o)
    assert first.transitions_per_s > 250  # ≈ where 300 calls/s per action runs out


def test_with_continuation_a_standard_fifo_queue_carries_the_trace(simulated):
    settings, _fleet, samples = simulated
    assert capacity.phases_per_message(settings) == 6  # chains of 30 s over phases of 5 s
    standard = replace(settings, high_throughput_fifo=False)
    every = loads(samples, standard)
    for second, x in enumerate(every):
        assert capacity.exceeded(x, capacity.budgets_for(standard)) == [], f"t={second}s: {x}"
    assert max(x.receive_calls_per_s for x in every) < 300


def test_without_a_pooler_the_fleet_is_far_past_any_connection_budget(simulated):
    settings, _fleet, samples = simulated
    peak_clients = max(x.client_connections for x in loads(samples, settings))
    # Without a pooler every client connection is a server connection.
    assert peak_clients > 5 * capacity.Budgets().server_connections * 10


def test_the_capacity_page_shows_the_model_s_plans():
    """docs/reference/capacity.md's two plan tables are what ``python -m bench.capacity``
    prints at the documented settings, with continuation and without."""
    page = (Path(__file__).resolve().parents[2] / "docs/reference/capacity.md").read_text()
    settings = capacity.Settings()
    for plan in (capacity.plan_table(settings),
                 capacity.plan_table(replace(settings, continuation=False))):
        assert plan in page
