"""A plain (non-editable) build ships one import package, ``phasegate``, with everything a worker
needs (SQL included), and nothing named ``worker`` or ``orchestrator`` at the top level.

The development venv holds an editable install whose finder maps ``phasegate`` to this checkout,
so the other tests run the source tree by design. This test is the one that proves the built
artifact: it installs the wheel into a fresh venv and imports it from outside the checkout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

from phasegate.sql import migration_files
from tests.helpers import ROOT

SQL_FILES = ("queries", "branches", "governance", "control", "schema", "demo")


def build_wheel(out: Path) -> Path:
    # From a copy of the sources: setuptools reuses a checkout's build/ directory, and a stale
    # one (say, from before a module moved) would put files in the wheel the tree no longer has.
    source = out.parent / f"{out.name}-src"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*_cache", "site"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(source)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return next(out.glob("phasegate-*.whl"))


def test_wheel_contains_one_package_sql_and_console_script(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"phasegate/sql/{name}.sql" for name in SQL_FILES} <= names
    for version, name, _ in migration_files():
        assert f"phasegate/sql/migrations/{version:04d}_{name}.sql" in names
    assert {"phasegate/__init__.py", "phasegate/cli.py", "phasegate/py.typed",
            "phasegate/worker/__init__.py", "phasegate/worker/runtime.py",
            "phasegate/worker/py.typed", "phasegate/orchestrator/__init__.py",
            "phasegate/orchestrator/api.py", "phasegate/orchestrator/py.typed"} <= names
    tops = {name.split("/", 1)[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"phasegate"}
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "phasegate = phasegate.cli:main" in text


# Run by the fresh venv's interpreter from a directory outside the checkout.
PROBE = """
import importlib.util, json, pathlib, sys
import phasegate, phasegate.cli, phasegate.worker.runtime, phasegate.orchestrator.api
from phasegate import Context, NonRetryableError, Workflow
print(json.dumps({
    "phasegate": phasegate.__file__,
    "runtime": phasegate.worker.runtime.__file__,
    "api": phasegate.orchestrator.api.__file__,
    "worker_dir_is_link": pathlib.Path(phasegate.worker.__file__).parent.is_symlink(),
    "orchestrator_dir_is_link":
        pathlib.Path(phasegate.orchestrator.__file__).parent.is_symlink(),
    "top_level": [name for name in ("worker", "orchestrator")
                  if importlib.util.find_spec(name) is not None],
    "sdk": [Workflow.__module__, Context.__module__, NonRetryableError.__module__],
}))
"""


def test_fresh_venv_imports_the_installed_package_only(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    # The wheel goes in with this venv's pip (no network, no dependencies); the third-party
    # dependencies come from the development venv through a plain path line, which does not run
    # that venv's .pth files, so its editable finder for this checkout stays out.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
         "--target", str(site), str(wheel)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    probe = subprocess.run([str(python), "-I", "-c", PROBE], cwd=outside,
                           capture_output=True, text=True, check=False)
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = json.loads(probe.stdout)
    for key in ("phasegate", "runtime", "api"):
        assert found[key].startswith(str(site)), (key, found[key])
    assert found["runtime"] == str(site / "phasegate" / "worker" / "runtime.py")
    assert not found["worker_dir_is_link"] and not found["orchestrator_dir_is_link"]
    installed = site / "phasegate" / "worker"
    assert installed.is_dir() and not installed.is_symlink()
    assert found["top_level"] == []
    assert not (site / "worker").exists() and not (site / "orchestrator").exists()
    assert found["sdk"] == ["phasegate.workflow", "phasegate.context", "phasegate.workflow"]


def test_wheel_metadata_license_urls_classifiers_and_typing_markers(tmp_path: Path) -> None:
    import tomllib
    from email.parser import Parser

    wheel = zipfile.ZipFile(build_wheel(tmp_path))
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
    # PEP 561: every top-level package (one: phasegate) ships its py.typed marker.
    packages = {n.split("/")[0] for n in names if n.count("/") == 1 and
                n.endswith("/__init__.py")}
    assert packages and all(f"{p}/py.typed" in names for p in packages), packages
