"""What one chaos run is asked to do: its seed and size, its route to Postgres, and the share
of each workload kind (bench/chaos/mix.py turns the shares into each run's kind)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from phasegate.db import Pooler


@dataclass
class ChaosConfig:
    seed: int
    workflows: int
    workers: int = 4
    long: bool = False
    concurrency: int = 8
    drain_bound_s: float = 120.0
    log_dir: Path | None = None
    # Workers and relay reach Postgres through PgBouncer in transaction mode
    # (commit-cut proxy -> PgBouncer -> server); the invariants are read directly.
    pgbouncer: bool = False
    # Every Nth run is a chaos-tree run (nested branches under the same faults); 0: none.
    branching_every: int = 0
    # Every Nth run is a chaos-keyed run (a concurrency key; invariant I10); 0: none.
    keyed_every: int = 0
    # Every Nth run is a chaos-wait run (a timer and a signal; invariant I11); 0: none.
    wait_every: int = 0
    # Local continuation in the fleet (PHASEGATE_CONTINUATION; on by default, as in production).
    continuation: bool = True
    # The fleet's PHASEGATE_DATABASE_POOLER ("pgbouncer": statements named by their text).
    pooler: Pooler = "transaction"
