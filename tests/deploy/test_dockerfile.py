"""The Dockerfile's structure (no Docker engine here to build it): multi-stage, slim base,
the dependencies from the hash-pinned image lock, a final stage without build
tools, the chart's non-root uid, and `phasegate` as the entrypoint."""

from __future__ import annotations

import fnmatch
import re
import tomllib

import pytest

from tests.deploy import chart
from tests.deploy.dockerfile import parse

DOCKERFILE = chart.ROOT / "Dockerfile"
BUILD_TOOLS = re.compile(
    r"\b(apt-get install|apt install|apk add|gcc|g\+\+|make|build-essential|"
    r"pip install|python3?-dev|libpq-dev|curl|wget|git)\b")


@pytest.fixture(scope="module")
def stages():
    _, parsed = parse(DOCKERFILE)
    return parsed


@pytest.fixture(scope="module")
def pyproject():
    return tomllib.loads((chart.ROOT / "pyproject.toml").read_text())


def test_multi_stage_on_a_slim_python_base(stages, pyproject):
    assert len(stages) >= 2
    wanted = pyproject["project"]["requires-python"].removeprefix(">=")
    for stage in stages:
        assert re.fullmatch(r"python:(\d+\.\d+)(\.\d+)?-slim(-\w+)?@sha256:[0-9a-f]{64}",
                            stage.image), f"{stage.image}: the base is pinned by digest"
        assert stage.image.startswith(f"python:{wanted}")


def test_final_stage_carries_oci_labels(stages, pyproject):
    labels = " ".join(i.args for i in stages[-1].all("LABEL"))
    for key in ("title", "description", "version", "revision", "created", "source",
                "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert f'licenses="{pyproject["project"]["license"]}"' in labels


def test_build_stage_installs_the_locked_dependencies_then_the_package(stages, pyproject):
    build = stages[0]
    installs = [line for line in build.run_text().split("&&") if "pip install" in line]
    # Every dependency comes from the hash-pinned image lock; the package itself adds none.
    assert any(re.search(r"pip install --require-hashes -r requirements/image\.lock(\s|$)", line)
               for line in installs), installs
    (package,) = [line for line in installs if re.search(r"\s\.(\s|$)", line)]
    assert "--no-deps" in package and "--no-build-isolation" in package, package
    copied = " ".join(i.args for i in build.all("COPY"))
    packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    needed = ["pyproject.toml", "requirements/image.lock", "LICENSE",
              pyproject["project"]["readme"]]
    needed += [p.rstrip("*") for p in packages]
    for name in needed:
        assert re.search(rf"(^|\s){re.escape(name)}(\s|$)", copied), f"{name} not copied"
    assert "phasegate" in pyproject["project"]["scripts"]


def test_image_lock_pins_every_requirement_with_a_hash():
    text = (chart.ROOT / "requirements" / "image.lock").read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2].strip())
    names = set()
    for entry in entries:
        requirement = entry.splitlines()[0]
        assert re.match(r"[A-Za-z0-9._-]+==\S+", requirement), requirement
        assert "--hash=sha256:" in entry, requirement
        names.add(requirement.split("==")[0].lower())
    # the build backend the Dockerfile's --no-build-isolation install relies on
    assert {"setuptools", "wheel", "aioboto3", "asyncpg", "rich"} <= names


def test_final_stage_has_no_build_tools(stages):
    final = stages[-1]
    assert BUILD_TOOLS.search(final.run_text()) is None, final.run_text()
    (copy,) = [i for i in final.all("COPY") if "--from=" in i.args]
    assert f"--from={stages[0].name}" in copy.args
    assert "pip uninstall" in final.run_text()  # not even pip ships in the final image


def test_runs_as_the_charts_non_root_uid(stages):
    final = stages[-1]
    (user,) = final.all("USER")
    uid, _, gid = user.args.partition(":")
    values = chart.load_values(chart.CHART_DIR / "values.yaml")
    assert int(uid) == values["securityContext"]["runAsUser"] == 10001
    assert int(gid) == values["securityContext"]["runAsGroup"]
    last_user_index = final.instructions.index(user)
    assert all(i.keyword != "RUN" for i in final.instructions[last_user_index:])


def test_entrypoint_is_phasegate(stages):
    final = stages[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert entrypoint.exec_form() == ["phasegate"]
    (cmd,) = final.all("CMD")
    assert cmd.exec_form() == ["worker"]


def test_dockerignore_keeps_what_the_build_copies(stages):
    patterns = [line.strip() for line in (chart.ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sources = []
    for copy in stages[0].all("COPY"):
        sources += [w for w in copy.args.split()[:-1] if not w.startswith("--")]
    for source in sources:
        assert (chart.ROOT / source).exists() or source == "README.md", source
        assert not any(fnmatch.fnmatch(source, p) for p in patterns), source
    assert ".venv" in patterns and ".git" in patterns
