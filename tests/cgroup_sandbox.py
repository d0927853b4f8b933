"""A memory-limited cgroup for one worker process, for the watchdog tests and the bench.

Hybrid hosts (v2 tree without a memory controller, as on this project's machines): a v1
``memory`` child with ``memory.limit_in_bytes`` under this process's own v1 memory cgroup,
plus a child of this process's own v2 cgroup so the worker gets its own ``memory.pressure``.
Pure v2 hosts: one v2 child with ``memory.max``. The worker is written into the children by
a shell that then ``exec``s it, so it discovers its cgroups on its very first read.

``CgroupSandbox.create()`` raises ``SandboxUnavailable`` with the reason when this host or
user cannot create cgroups; ``close()`` kills what is left inside and removes every directory
it created, also after a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any

from phasegate.settings import Settings
from phasegate.worker import cgroups
from tests.helpers import ROOT, settings_env


class SandboxUnavailable(Exception):
    """Cgroups cannot be created here; the message says why."""


class CgroupSandbox:
    def __init__(self, mode: str, dirs: list[Path], memory_dir: Path, v2_dir: Path) -> None:
        self.mode = mode            # "hybrid" (v1 memory + v2 PSI) or "unified"
        self.dirs = dirs            # every directory we created, to rmdir
        self.memory_dir = memory_dir
        self.v2_dir = v2_dir
        self.pids: list[int] = []

    @classmethod
    def create(cls, prefix: str = "phasegate-test") -> CgroupSandbox:
        if os.geteuid() != 0:
            raise SandboxUnavailable("creating cgroups needs root (or a delegated subtree)")
        paths = cgroups.discover()
        if paths.v2_dir is None or paths.memory_pressure is None:
            raise SandboxUnavailable(f"no cgroup v2 with PSI for this process ({paths.layout})")
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        created: list[Path] = []
        try:
            v2_child = paths.v2_dir / name
            v2_child.mkdir()
            created.append(v2_child)
            if (v2_child / "memory.max").exists():
                return cls("unified", created, v2_child, v2_child)
            if _enable_v2_memory(paths.v2_dir) and (v2_child / "memory.max").exists():
                return cls("unified", created, v2_child, v2_child)
            if paths.v1_memory_dir is None:
                raise SandboxUnavailable("v2 child has no memory controller and there is no "
                                         "v1 memory hierarchy to limit it with")
            v1_child = paths.v1_memory_dir / name
            v1_child.mkdir()
            created.append(v1_child)
            return cls("hybrid", created, v1_child, v2_child)
        except SandboxUnavailable:
            _remove(created)
            raise
        except OSError as exc:
            _remove(created)
            raise SandboxUnavailable(f"cannot create a child cgroup: {exc}") from exc

    # -- limits and counters ------------------------------------------------------------------

    def set_limit(self, limit_bytes: int) -> None:
        name = "memory.max" if self.mode == "unified" else "memory.limit_in_bytes"
        (self.memory_dir / name).write_text(str(limit_bytes))

    def usage(self) -> int:
        name = "memory.current" if self.mode == "unified" else "memory.usage_in_bytes"
        return int((self.memory_dir / name).read_text())

    def oom_kills(self) -> int:
        name = "memory.events" if self.mode == "unified" else "memory.oom_control"
        return cgroups.parse_flat_keyed((self.memory_dir / name).read_text()).get("oom_kill", 0)

    @property
    def procs_files(self) -> list[Path]:
        return list(dict.fromkeys([self.memory_dir / "cgroup.procs",
                                   self.v2_dir / "cgroup.procs"]))

    # -- the worker inside --------------------------------------------------------------------

    def spawn_worker(self, settings: Settings, *, modules: str, log_path: Path,
                     extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        process = spawn_logged_worker(settings, modules=modules, log_path=log_path,
                                      extra_env=extra_env, cgroup_procs=self.procs_files)
        self.pids.append(process.pid)
        return process

    def close(self) -> None:
        for pid in self.pids:  # only the processes we started
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _remove(self.dirs)

    def __enter__(self) -> CgroupSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spawn_logged_worker(settings: Settings, *, modules: str, log_path: Path,
                        extra_env: dict[str, str] | None = None,
                        cgroup_procs: list[Path] | None = None) -> subprocess.Popen[bytes]:
    """A worker process whose JSON log goes to ``log_path`` (a file never fills up the way
    an unread pipe does); with ``cgroup_procs``, it joins those cgroups before exec."""
    env = {**os.environ, **settings_env(settings), "PHASEGATE_WORKFLOW_MODULES": modules,
           "PHASEGATE_LOG_FORMAT": "json", "PYTHONPATH": str(ROOT), **(extra_env or {})}
    script = 'for f in "$@"; do echo $$ > "$f" || exit 97; done; exec "$PG_PY" -m ' \
             'phasegate.cli worker'
    env["PG_PY"] = sys.executable
    argv = ["/bin/sh", "-c", script, "sh", *[str(p) for p in cgroup_procs or []]]
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=log)


def _enable_v2_memory(parent: Path) -> bool:
    try:
        (parent / "cgroup.subtree_control").write_text("+memory")
    except OSError:
        return False  # not in cgroup.controllers, or processes in a non-root parent
    return True


def _remove(dirs: list[Path], timeout: float = 10.0) -> None:
    """rmdir children first; a killed process may take a moment to leave its cgroup."""
    for directory in reversed(dirs):
        deadline = time.monotonic() + timeout
        while directory.exists():
            try:
                directory.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    print(f"cgroup_sandbox: could not remove {directory}", file=sys.stderr)
                    break
                time.sleep(0.05)  # polling the kernel with a deadline, not a synchronisation


def log_events(path: Path, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of one event a worker wrote to ``path``."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event:
            out.append(record)
    return out
