"""moto's SQS server (``bench/chaos/moto_server.py``) as a process of its own, started and
stopped by the chaos run."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.chaos.fleet import ROOT
from phasegate.orchestrator.embedded import free_port, local_aws_env


class MotoProcess:
    """moto's SQS server in its own process, so its work does not share the runner's GIL."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        log = open(log_dir / "moto.log", "wb")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.chaos.moto_server", "-H", "127.0.0.1", "-p",
             str(self.port)],
            stdout=log, stderr=log, cwd=ROOT,
            env={**os.environ, **local_aws_env(), "PYTHONPATH": str(ROOT)})
        log.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def ready(self, within_s: float = 30) -> None:
        deadline = time.monotonic() + within_s
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("moto server did not start") from None
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
