"""Thin wrappers over the docker CLI for the image tests (no Docker SDK: the CLI is what
operators and CI use)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import Any


def docker(*args: str, check: bool = True,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check,
                          timeout=timeout)


def docker_available() -> bool:
    return shutil.which("docker") is not None and docker("info", check=False).returncode == 0


@dataclass
class Container:
    """A container started detached; ``name`` is unique per test run."""

    name: str

    @classmethod
    def start(cls, run_args: list[str], prefix: str) -> Container:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        docker("run", "--detach", "--name", name, *run_args)
        return cls(name)

    def state(self) -> dict[str, Any]:
        out = docker("inspect", "--format", "{{json .State}}", self.name).stdout
        state: dict[str, Any] = json.loads(out)
        return state

    def logs(self) -> str:
        proc = docker("logs", self.name, check=False)
        return proc.stdout + proc.stderr

    def events(self) -> list[dict[str, Any]]:
        """The structlog JSON lines the container wrote."""
        out = []
        for line in self.logs().splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out

    def stop(self, grace_seconds: int) -> tuple[int, float]:
        """`docker stop -t grace` (SIGTERM, SIGKILL after the grace): (exit code, seconds)."""
        started = time.monotonic()
        docker("stop", "--time", str(grace_seconds), self.name, timeout=grace_seconds + 60)
        took = time.monotonic() - started
        return int(self.state()["ExitCode"]), took

    def wait(self, timeout: float) -> int:
        proc = docker("wait", self.name, timeout=timeout)
        return int(proc.stdout.strip())

    def remove(self) -> None:
        docker("rm", "--force", self.name, check=False)
