"""``python -m bench.chaos --seed N --workflows N [--workers N] [--long] [--branching N]
[--pgbouncer] [--keyed N] [--waits N] [--continuation on|off] [--pooler MODE]``: one chaos run.

Exit status 0 when every invariant held, 1 otherwise (the report names the failing invariant,
the seed and the full fault schedule, which the same command line reproduces).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.chaos.config import ChaosConfig
from bench.chaos.runner import run_chaos
from phasegate.db import POOLERS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--long", action="store_true",
                        help="the long schedule: a 900 s fault window, five times the faults")
    parser.add_argument("--drain-bound", type=float, default=120.0,
                        help="I7: seconds allowed from the last fault to a drained system")
    parser.add_argument("--log-dir", type=Path, default=None)
    parser.add_argument("--pgbouncer", action="store_true",
                        help="workers and relay reach Postgres through PgBouncer "
                             "(transaction mode, 6 server connections)")
    parser.add_argument("--branching", type=int, default=0, metavar="N",
                        help="every Nth run is a branching run (a fork of 2 whose branches "
                             "fork 2 again; invariant I8); 0: none")
    parser.add_argument("--keyed", type=int, default=0, metavar="N",
                        help="one run in N is keyed, in bursts of 3 of one key (two keys; "
                             "a limit of 2 runs or a rate of 1 admission per 4 s; invariants "
                             "I10, I12); 0: none")
    parser.add_argument("--waits", type=int, default=0, metavar="N",
                        help="every Nth run waits: a timer, then a signal the runner sends "
                             "(invariant I11); 0: none")
    parser.add_argument("--continuation", choices=("on", "off"), default="on",
                        help="local continuation in the fleet (on, the default, as in "
                             "production; off: every hop through SQS, no mid_chain kill)")
    parser.add_argument("--pooler", choices=POOLERS, default="transaction",
                        help="the fleet's PHASEGATE_DATABASE_POOLER (pgbouncer: statements "
                             "named by their text; with --pgbouncer, through PgBouncer)")
    args = parser.parse_args(argv)
    report = run_chaos(ChaosConfig(seed=args.seed, workflows=args.workflows,
                                   workers=args.workers, long=args.long,
                                   concurrency=args.concurrency,
                                   drain_bound_s=args.drain_bound, log_dir=args.log_dir,
                                   pgbouncer=args.pgbouncer,
                                   branching_every=args.branching,
                                   keyed_every=args.keyed, wait_every=args.waits,
                                   continuation=args.continuation == "on",
                                   pooler=args.pooler))
    print(report.text(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
