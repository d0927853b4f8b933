"""The package's floor plan: one import package, and the layers' import rule.

The rule itself (the core imports neither plane, the planes never import each other, only the
CLI wires both) is a set of import-linter contracts in pyproject.toml; this runs them, so a
plain pytest run enforces it too. The source scan covers what import-linter cannot see: tests,
benchmarks, docs snippets and scripts that import the plane folders as top-level packages.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

TOP_LEVEL_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:worker|orchestrator)\b", re.MULTILINE)
SCANNED = ("phasegate", "worker", "orchestrator", "tests", "bench", "docs", "scripts")


def sources() -> list[Path]:
    # phasegate/worker and phasegate/orchestrator are links to scanned folders: count files once.
    found = {path.resolve() for top in SCANNED for path in (ROOT / top).rglob("*")
             if path.suffix in {".py", ".md", ".sh"} and path.is_file()}
    return sorted(found)


def test_nothing_imports_the_plane_folders_as_top_level_packages() -> None:
    files = sources()
    assert len(files) > 100, "the scan found the sources"
    offenders = [f"{path}: {match.group(0).strip()}"
                 for path in files for match in TOP_LEVEL_IMPORT.finditer(path.read_text())]
    assert offenders == []


def test_plane_folders_are_mapped_into_the_package_by_relative_links() -> None:
    for plane in ("worker", "orchestrator"):
        link = ROOT / "phasegate" / plane
        assert link.is_symlink() and str(link.readlink()) == f"../{plane}"


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        found = shutil.which("lint-imports")
        if found is None:
            pytest.fail("import-linter is not installed (it is in the test extras)")
        lint = Path(found)
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
    assert "0 broken" in done.stdout
