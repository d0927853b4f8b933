"""Retry delays with full jitter (phasegate/backoff.py) where the code backs off: phase retries,
startup connect retries, the receive loop and the relay."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from phasegate.backoff import Backoff, full_jitter
from phasegate.orchestrator.relay import RELAY_RETRY_CAP_S, Relay
from phasegate.worker.transition import PhaseTransition, TransitionConfig


def test_full_jitter_draws_from_zero_to_the_capped_exponential_window() -> None:
    rng = random.Random(7)
    for attempt, window in [(0, 1.0), (1, 2.0), (3, 8.0), (5, 20.0), (400, 20.0)]:
        draws = [full_jitter(attempt, base=1.0, cap=20.0, rng=rng) for _ in range(2000)]
        assert all(0.0 <= d <= window for d in draws)
        # the whole window is used: not a bare exponential (always the top) nor a fixed fraction
        assert min(draws) < 0.05 * window and max(draws) > 0.95 * window


def test_full_jitter_is_the_aws_formula_on_the_given_random_source() -> None:
    expected = random.Random(42)
    rng = random.Random(42)
    for attempt in range(8):
        assert full_jitter(attempt, base=0.5, cap=10.0, rng=rng) == expected.uniform(
            0.0, min(10.0, 0.5 * 2 ** attempt))


def test_backoff_counts_attempts_and_resets_after_a_success() -> None:
    backoff = Backoff(base=1.0, cap=100.0, rng=random.Random(3))
    reference = random.Random(3)
    assert [backoff.next() for _ in range(4)] == [reference.uniform(0, 2.0 ** n)
                                                  for n in range(4)]
    backoff.reset()
    assert backoff.attempt == 0 and backoff.next() == reference.uniform(0, 1.0)
    with pytest.raises(ValueError):
        Backoff(base=-1.0, cap=1.0)


def test_phase_retry_delay_is_whole_seconds_within_the_window() -> None:
    config = TransitionConfig(worker_id="w", max_message_bytes=1, max_attempts=5,
                              retry_backoff_s=2.0, retry_backoff_max_s=30.0,
                              jitter=random.Random(11))
    transition: Any = PhaseTransition.__new__(PhaseTransition)
    transition.config = config
    reference = random.Random(11)
    for attempts in range(1, 9):  # the n-th delivery's retry: window base * 2**(n-1), capped
        window = min(30.0, 2.0 * 2 ** (attempts - 1))
        delay = transition._backoff(attempts)
        assert delay == round(reference.uniform(0, window))
        assert isinstance(delay, int) and 0 <= delay <= window
    zero = SimpleNamespace(config=TransitionConfig(
        worker_id="w", max_message_bytes=1, max_attempts=1, retry_backoff_s=0.0,
        retry_backoff_max_s=30.0))
    assert PhaseTransition._backoff(zero, 5) == 0  # type: ignore[arg-type]


class _DownPool:
    """A pool whose every query fails, as during a database outage."""

    def __init__(self, relay: list[Relay], rounds: int) -> None:
        self.calls = 0
        self.relay = relay
        self.rounds = rounds

    async def fetch(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls >= self.rounds:
            self.relay[0].stop()
        raise ConnectionError("connection refused")


async def test_relay_backs_off_with_full_jitter_while_rounds_fail() -> None:
    holder: list[Relay] = []
    pool = _DownPool(holder, rounds=6)
    store: Any = SimpleNamespace(pool=pool, _q={"requeue_stalled": "-- q"})
    relay = Relay(store=store, queue=None,  # type: ignore[arg-type]
                  interval_s=0.001, jitter=random.Random(5))
    holder.append(relay)
    with capture_logs() as logs:
        await relay.run()
    waits = [e["retry_in_s"] for e in logs if e["event"] == "relay_round_failed"]
    reference = random.Random(5)
    assert waits == [round(reference.uniform(0, min(RELAY_RETRY_CAP_S, 0.001 * 2 ** n)), 3)
                     for n in range(6)]
    assert pool.calls == 6  # failures are logged and retried, never fatal
