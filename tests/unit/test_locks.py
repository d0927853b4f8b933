"""The hash-pinned lock files (scripts/lock.sh) cover pyproject.toml and agree with each other,
so a dependency added without relocking fails here rather than on a fresh machine."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: str) -> dict[str, str]:
    """name -> version of every entry; each must carry at least one sha256."""
    text = (ROOT / "requirements" / lock).read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text[text.index("\n", text.index("#    ")) + 1:])
    found: dict[str, str] = {}
    for entry in entries:
        first = entry.splitlines()[0]
        match = re.match(r"([A-Za-z0-9._-]+)==([^\s;\\]+)", first)
        assert match, f"{lock}: not an exact pin: {first}"
        assert "--hash=sha256:" in entry, f"{lock}: {first} has no hash"
        found[normalize(match[1])] = match[2]
    return found


def names(requirements: list[str]) -> set[str]:
    return {normalize(REQUIREMENT_NAME.match(r)[1]) for r in requirements}  # type: ignore[index]


def test_every_dependency_and_extra_is_locked_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = names(project["dependencies"])
    extras = set().union(*(names(r) for r in project["optional-dependencies"].values()))
    ci, image = pins("ci.lock"), pins("image.lock")
    assert runtime | extras <= set(ci), sorted((runtime | extras) - set(ci))
    build = names([line for line in (ROOT / "requirements" / "build.in").read_text()
                   .splitlines() if line.strip() and not line.startswith("#")])
    assert runtime | build <= set(image), sorted((runtime | build) - set(image))


def test_the_image_runs_the_versions_the_tests_run() -> None:
    ci, image = pins("ci.lock"), pins("image.lock")
    assert set(image) <= set(ci)
    assert {n: v for n, v in image.items() if ci[n] != v} == {}
    # test-only tools stay out of the image
    assert not {"pytest", "moto", "mypy", "ruff", "uv"} & set(image)
