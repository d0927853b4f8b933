"""Retry delays with full jitter: ``random(0, min(cap, base * 2**attempt))``.

The AWS Architecture Blog's "Exponential Backoff And Jitter" compares the variants: a bare
exponential keeps every client that failed together retrying together (a worker fleet that
lost its database at one moment hammers it again at one moment), while full jitter spreads
the retries over the whole window and does the least total work. ``attempt`` counts from 0
(the first retry's window is ``base``). The random source is injectable so tests can seed it.
"""

from __future__ import annotations

import random

__all__ = ["Backoff", "full_jitter"]

# Past this exponent the window is far above any cap and 2**n only costs a big int.
_MAX_EXPONENT = 62


def full_jitter(attempt: int, *, base: float, cap: float,
                rng: random.Random | None = None) -> float:
    """A delay drawn uniformly from [0, min(cap, base * 2**attempt)] seconds."""
    ceiling = min(cap, base * 2.0 ** min(max(0, attempt), _MAX_EXPONENT))
    return (rng or _RANDOM).uniform(0.0, max(0.0, ceiling))


class Backoff:
    """The delays of one retry loop: ``next()`` after each failure, ``reset()`` on success."""

    def __init__(self, *, base: float, cap: float, rng: random.Random | None = None) -> None:
        if base < 0 or cap < 0:
            raise ValueError("backoff base and cap must not be negative")
        self.base = base
        self.cap = cap
        self.attempt = 0
        self._rng = rng

    def next(self) -> float:
        delay = full_jitter(self.attempt, base=self.base, cap=self.cap, rng=self._rng)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


_RANDOM = random.Random()
