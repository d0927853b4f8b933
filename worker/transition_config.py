"""What the transition is configured with, and how a worker's settings become it.

``TransitionConfig`` and ``ContinuationConfig`` are plain values (unit tests build them
directly); ``transition_config`` and ``continuation_config`` read them from ``Settings``, the one
place the worker maps ``PHASEGATE_*`` settings onto the transition.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from phasegate.backoff import full_jitter
from phasegate.branches import Bounds
from phasegate.residency import StoreRouter
from phasegate.settings import Settings
from phasegate.store import Store
from phasegate.worker.continuation import ContinuationConfig


@dataclass(frozen=True)
class TransitionConfig:
    worker_id: str
    max_message_bytes: int
    max_attempts: int
    retry_backoff_s: float
    retry_backoff_max_s: float
    stale_after_s: float = 3600.0
    phase_timeout_s: float = 0.0
    # Nested branches: PHASEGATE_BRANCH_MAX_DEPTH / PHASEGATE_BRANCH_MAX_LIVE.
    branch_bounds: Bounds = field(default_factory=Bounds)
    # The random source of the retry delays' jitter (seeded in tests; None: a shared one).
    jitter: random.Random | None = field(default=None, compare=False)


def retry_delay_s(config: TransitionConfig, attempts: int) -> int:
    """Whole seconds (a visibility timeout) with full jitter: the n-th retry waits
    random(0, min(max, base * 2**(n-1))), so a fleet that failed together does not retry
    together (phasegate/backoff.py)."""
    delay = full_jitter(attempts - 1, base=config.retry_backoff_s,
                        cap=config.retry_backoff_max_s, rng=config.jitter)
    return max(0, round(delay))


def transition_config(settings: Settings) -> TransitionConfig:
    return TransitionConfig(
        worker_id=settings.worker_id,
        max_message_bytes=settings.max_message_bytes,
        max_attempts=settings.max_attempts,
        retry_backoff_s=settings.retry_backoff_s,
        retry_backoff_max_s=settings.retry_backoff_max_s,
        stale_after_s=settings.stale_after_s,
        phase_timeout_s=settings.phase_timeout_s,
        branch_bounds=Bounds(settings.branch_max_depth, settings.branch_max_live))


def continuation_config(settings: Settings, store: Store | None) -> ContinuationConfig:
    # Off with several stores (PHASEGATE_STORES): the heartbeat extends leases by outbox
    # id, and outbox ids are per database.
    return ContinuationConfig(
        enabled=settings.continuation and not isinstance(store, StoreRouter),
        max_hops=settings.continuation_max_hops,
        max_s=settings.continuation_max_s,
        lease_s=settings.visibility_timeout_s,
        leased_send=settings.leased_send and not isinstance(store, StoreRouter))
