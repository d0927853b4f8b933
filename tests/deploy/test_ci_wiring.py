"""CI builds and runs the image and checks the generated chart README: the steps are wired in
and cannot be switched off from CI's side."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.deploy import chart

ROOT = chart.ROOT


def test_ci_runs_the_image_step_and_cannot_skip_it():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "unset PHASEGATE_SKIP_IMAGE" in ci
    assert ci.index("unset PHASEGATE_SKIP_IMAGE") < ci.index("scripts/test.sh")
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert "bash scripts/image-test.sh" in test_sh
    assert "scripts/chart_readme.py --check" in test_sh
    image_sh = (ROOT / "scripts" / "image-test.sh").read_text()
    assert ". scripts/docker-daemon.sh" in image_sh and "docker_up " in image_sh
    image_sh += (ROOT / "scripts" / "docker-daemon.sh").read_text()
    # It installs what it needs and builds from nothing when no cached base exists.
    for needed in ("docker.io", "debootstrap", "docker build", "--build-arg",
                   "PYTHON_IMAGE=", "pytest", "tests/image"):
        assert needed in image_sh, needed


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_chart_readme_is_what_the_generator_writes():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "chart_readme.py"), "--check"],
                          capture_output=True, text=True, check=False, timeout=170)
    assert proc.returncode == 0, proc.stdout + proc.stderr
