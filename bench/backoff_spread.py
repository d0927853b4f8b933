"""How full jitter spreads the retries of phases that failed at the same moment.

    .venv/bin/python bench/backoff_spread.py [--clients 1000] [--attempts 5] [--seed 1]

N messages fail together (a dependency they all call went down) and each retries with
phasegate's phase-retry policy (PHASEGATE_RETRY_BACKOFF_S=2, ..._MAX_S=300, whole seconds)
until --attempts; the dependency sees the retries of every attempt. Prints, for a bare
exponential (the policy before phasegate/backoff.py) and for full jitter, the busiest second's
retries and how many distinct seconds they fall in. A model of the delays only (the same
function the worker calls), no servers: the ratio is what matters.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

from phasegate.backoff import full_jitter

BASE_S = 2.0
CAP_S = 300.0


def bare(attempt: int, _rng: random.Random) -> float:
    return min(CAP_S, BASE_S * 2.0 ** (attempt - 1))


def jittered(attempt: int, rng: random.Random) -> float:
    return full_jitter(attempt - 1, base=BASE_S, cap=CAP_S, rng=rng)


def schedule(policy: object, clients: int, attempts: int,
             seed: int) -> list[Counter[int]]:
    """Per attempt: how many of that attempt's retries land in each second."""
    rng = random.Random(seed)
    arrivals: list[Counter[int]] = [Counter() for _ in range(attempts)]
    for _ in range(clients):
        at = 0
        for attempt in range(1, attempts + 1):
            at += round(policy(attempt, rng))  # type: ignore[operator]
            arrivals[attempt - 1][at] += 1
    return arrivals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--attempts", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"{args.clients} messages failing together, {args.attempts} retries each "
          f"(base {BASE_S:g}s, cap {CAP_S:g}s): the busiest second of each retry wave")
    bare_waves = schedule(bare, args.clients, args.attempts, args.seed)
    jitter_waves = schedule(jittered, args.clients, args.attempts, args.seed)
    print("| retry | bare exponential: busiest second | full jitter: busiest second "
          "| full jitter: seconds spanned | ratio |")
    print("|---|---|---|---|---|")
    for n, (b, j) in enumerate(zip(bare_waves, jitter_waves, strict=True), start=1):
        print(f"| {n} | {max(b.values())} | {max(j.values())} | {max(j) - min(j) + 1} "
              f"| {max(b.values()) / max(j.values()):.1f}x |")


if __name__ == "__main__":
    main()
