"""The CI-sized chaos run (bench/chaos): a few hundred workflows over two seeds, every fault
kind of the schedule, the invariants (bench/chaos/invariants.py) checked from the database and
the downstream ledger.

Real parts only: a throwaway PostgreSQL cluster of its own (restarted ``-m immediate``
mid-run), moto's SQS server in its own process behind the fault proxy, worker processes and
the relay as OS processes; one seed reaches Postgres through PgBouncer in transaction mode.
A failure prints the seed and the whole fault schedule; the same ``python -m bench.chaos
--seed N --workflows N --workers N [--pgbouncer] [--keyed N] [--waits N]`` reproduces it.
"""

from __future__ import annotations

import pytest

from bench.chaos.config import ChaosConfig
from bench.chaos.runner import run_chaos

pytestmark = pytest.mark.slow

CI_WORKFLOWS = 120
CI_WORKERS = 3


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("seed", "route", "keyed_every", "wait_every"),
                         [(11, "direct", 3, 0), (12, "direct", 0, 4), (12, "pgbouncer", 0, 0)])
def test_chaos_invariants_hold(seed: int, route: str, keyed_every: int, wait_every: int,
                               tmp_path) -> None:
    # One seed also reaches Postgres through PgBouncer in transaction mode (6 server
    # connections): the same faults, the same invariants, no session state to lose. One
    # makes one run in three keyed (I10, I12: a key's limit and rate held under the same
    # faults), one every fourth a run that waits for a timer and a signal (I11).
    report = run_chaos(ChaosConfig(seed=seed, workflows=CI_WORKFLOWS, workers=CI_WORKERS,
                                   drain_bound_s=90.0, log_dir=tmp_path / f"chaos-{seed}",
                                   pgbouncer=route == "pgbouncer", keyed_every=keyed_every,
                                   wait_every=wait_every))
    assert report.ok, "\n" + report.text()
    # The run really was a chaos run: faults fired and work was redone, never doubled.
    assert report.fired.get("pg_restart", 0) >= 1
    kills = sum(v for k, v in report.fired.items() if k.startswith("kill@"))
    assert kills >= 6
