"""A plain (non-editable) build ships everything a worker needs, SQL included."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from phasegate.sql import migration_files
from tests.helpers import ROOT


def test_wheel_contains_packages_sql_and_console_script(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = next(tmp_path.glob("phasegate-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"phasegate/sql/queries.sql", "orchestrator/sql/queries.sql"} <= names
    for version, name, _ in migration_files():
        assert f"phasegate/sql/migrations/{version:04d}_{name}.sql" in names
    assert {"worker/__init__.py", "phasegate/cli.py", "worker/py.typed"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "phasegate = phasegate.cli:main" in text
    assert not any(n.startswith("tests/") for n in names)
