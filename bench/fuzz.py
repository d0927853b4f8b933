"""The hostile-input fuzzer, longer than CI runs it.

    python -m bench.fuzz --examples 2000 [--seed 7]

Runs tests/hostile/test_fuzz.py (real Postgres, moto over HTTP, two worker processes) with
PHASEGATE_FUZZ_EXAMPLES / PHASEGATE_FUZZ_SEED set; CI runs the same test with 80 examples and
a fixed seed. Exit status is pytest's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000, help="messages to generate")
    parser.add_argument("--seed", type=int, default=20261130, help="Hypothesis seed")
    args = parser.parse_args()
    env = {**os.environ, "PHASEGATE_FUZZ_EXAMPLES": str(args.examples),
           "PHASEGATE_FUZZ_SEED": str(args.seed)}
    # The test's own timeout is sized for CI's budget; a long run gets one per 100 messages.
    timeout = str(max(180, args.examples * 2))
    return subprocess.call(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         f"--timeout={timeout}", "tests/hostile/test_fuzz.py"], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
