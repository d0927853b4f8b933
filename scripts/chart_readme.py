#!/usr/bin/env python3
"""Regenerate (or, with --check, verify) the parameter tables of charts/phasegate/README.md
from the ``## @param`` comments in charts/phasegate/values.yaml.

The generator is bitnami's readme-generator-for-helm from npm, pinned below and installed on
first use into a cache directory ($PHASEGATE_NPM_CACHE, default ~/.cache/phasegate-npm).
Exit status: 0 current/regenerated, 1 stale (--check) or the generator refused the metadata,
2 npm/node missing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

GENERATOR = "@bitnami/readme-generator-for-helm@2.7.2"
ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "phasegate"


def generator_bin() -> Path:
    cache = Path(os.environ.get("PHASEGATE_NPM_CACHE",
                                Path.home() / ".cache" / "phasegate-npm")) / "readme-generator"
    binary = cache / "node_modules" / ".bin" / "readme-generator"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        print("chart_readme: node and npm are needed (apt-get install -y nodejs npm)",
              file=sys.stderr)
        raise SystemExit(2)
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund",
                    "--silent", GENERATOR], check=True)
    return binary


def generate(readme: Path) -> None:
    proc = subprocess.run([str(generator_bin()), "--values", str(CHART / "values.yaml"),
                           "--readme", str(readme)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "ERROR" in line]
        print("\n".join(errors) or proc.stderr, file=sys.stderr)
        raise SystemExit(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail (exit 1) when README.md is not what the generator writes")
    args = parser.parse_args()
    readme = CHART / "README.md"
    if not args.check:
        generate(readme)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "README.md"
        shutil.copy(readme, copy)
        generate(copy)
        if copy.read_text() != readme.read_text():
            print("charts/phasegate/README.md is stale: run python scripts/chart_readme.py",
                  file=sys.stderr)
            return 1
    print("charts/phasegate/README.md is current")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
