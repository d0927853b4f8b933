"""A plain (non-editable) build ships everything a worker needs, SQL included."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helpers import ROOT
from worker.sql import migration_files


def test_wheel_contains_packages_sql_and_console_script(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = next(tmp_path.glob("phasegate-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"worker/sql/queries.sql", "orchestrator/sql/queries.sql"} <= names
    for version, name, _ in migration_files():
        assert f"worker/sql/migrations/{version:04d}_{name}.sql" in names
    assert {"worker/__init__.py", "orchestrator/cli.py", "worker/py.typed"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "phasegate = orchestrator.cli:main" in text
    assert not any(n.startswith("tests/") for n in names)


def test_wheel_metadata_license_urls_classifiers_and_typing_markers(tmp_path: Path) -> None:
    import tomllib
    from email.parser import Parser

    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = zipfile.ZipFile(next(tmp_path.glob("phasegate-*.whl")))
    names = set(wheel.namelist())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    metadata = Parser().parsestr(wheel.read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode())
    # The license the metadata declares is the text the wheel ships.
    assert metadata["License-Expression"] == project["license"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    shipped = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    assert wheel.read(shipped) == (ROOT / "LICENSE").read_bytes()
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert urls["Source"] == "https://github.com/phasegate/phasegate"
    assert set(urls) >= {"Homepage", "Documentation", "Source", "Issues"}
    classifiers = metadata.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and classifiers == project["classifiers"]
    assert all(f":: {v}" in " ".join(classifiers) for v in ("3.11", "3.12"))
    # PEP 561: every top-level package ships its py.typed marker.
    packages = {n.split("/")[0] for n in names if n.count("/") == 1 and
                n.endswith("/__init__.py")}
    assert packages and all(f"{p}/py.typed" in names for p in packages), packages
