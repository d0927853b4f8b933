"""Fixtures for the image tests: the image under test, Helm homes, free host ports.

The image comes from ``$PHASEGATE_IMAGE`` (scripts/image-test.sh builds it and sets it); the
tests skip when it or a Docker daemon is missing, so a plain ``pytest tests/`` on a machine
without Docker is not broken. CI runs them through scripts/image-test.sh, which fails when
the build fails.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image.containers import docker, docker_available


@pytest.fixture(scope="session")
def image() -> str:
    name = os.environ.get("PHASEGATE_IMAGE")
    if not name:
        pytest.skip("PHASEGATE_IMAGE is not set (scripts/image-test.sh builds and sets it)")
    if not docker_available():
        pytest.skip("no Docker daemon answers")
    if docker("image", "inspect", name, check=False).returncode != 0:
        pytest.fail(f"image {name} does not exist")
    return name


@pytest.fixture(scope="session", autouse=True)
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("helm-home")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            mp.setenv(var, str(home / var.lower()))
        yield home


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
