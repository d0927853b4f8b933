"""Where this process's cgroup lives and what its files say.

Discovery reads ``/proc/self/cgroup`` and ``/proc/self/mountinfo``; nothing is hard-coded to
``/sys/fs/cgroup``. Hosts come in three shapes:

- **unified** (cgroup v2 only, EKS/most CI): one ``cgroup2`` mount, ``0::/path``;
- **hybrid**: v1 controllers under ``/sys/fs/cgroup/<controller>`` and a ``cgroup2`` mount
  (often ``/sys/fs/cgroup/unified``) that may hold no memory controller. PSI files
  (``memory.pressure``) exist in every v2 cgroup regardless; memory limits then come from
  the v1 ``memory`` controller;
- **legacy** (v1 only): no PSI at all; the watchdog stands down.

Every parser takes file *contents* (a ``str``) so unit tests feed recorded files. Malformed
lines are skipped, never fatal: the watchdog is advisory and must not crash on a new kernel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

# A v1 limit at or above this is "no limit" (the kernel reports PAGE_COUNTER_MAX * page size,
# e.g. 9223372036854771712).
V1_UNLIMITED = 1 << 62


# -- parsers (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class PressureLine:
    """One line of a PSI file: averages in percent, ``total`` in microseconds stalled."""

    avg10: float
    avg60: float
    avg300: float
    total_us: int


@dataclass(frozen=True)
class Pressure:
    some: PressureLine | None
    full: PressureLine | None


def parse_pressure(text: str) -> Pressure:
    """``memory.pressure`` / ``cpu.pressure``: ``some avg10=.. avg60=.. avg300=.. total=..``."""
    lines: dict[str, PressureLine] = {}
    for raw in text.splitlines():
        kind, _, rest = raw.strip().partition(" ")
        if kind not in ("some", "full"):
            continue
        values: dict[str, str] = {}
        for item in rest.split():
            key, sep, value = item.partition("=")
            if sep:
                values[key] = value
        try:
            lines[kind] = PressureLine(float(values["avg10"]), float(values["avg60"]),
                                       float(values["avg300"]), int(values["total"]))
        except (KeyError, ValueError):
            continue
    return Pressure(lines.get("some"), lines.get("full"))


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``key value`` per line (``memory.events``, ``memory.stat``, ``cpu.stat``)."""
    out: dict[str, int] = {}
    for raw in text.splitlines():
        parts = raw.split()
        if len(parts) != 2:
            continue
        try:
            out[parts[0]] = int(parts[1])
        except ValueError:
            continue
    return out


def parse_limit(text: str) -> int | None:
    """``memory.max``/``memory.high`` (``max`` = none) or a v1 ``limit_in_bytes``."""
    value = text.strip()
    if not value or value == "max":
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return None if number >= V1_UNLIMITED or number < 0 else number


@dataclass(frozen=True)
class ProcCgroup:
    """``/proc/self/cgroup``: the v2 path (``0::/x``) and v1 paths per controller."""

    v2_path: str | None
    v1_paths: dict[str, str] = field(default_factory=dict)


def parse_proc_cgroup(text: str) -> ProcCgroup:
    v2: str | None = None
    v1: dict[str, str] = {}
    for raw in text.splitlines():
        parts = raw.strip().split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hierarchy_id, controllers, path = parts
        if hierarchy_id == "0" and controllers == "":
            v2 = path
        else:
            for controller in controllers.split(","):
                if controller:
                    v1[controller] = path
    return ProcCgroup(v2, v1)


@dataclass(frozen=True)
class CgroupMount:
    root: str        # the path inside the hierarchy that is mounted (field 4 of mountinfo)
    mountpoint: str  # where it is mounted


@dataclass(frozen=True)
class Mounts:
    v2: CgroupMount | None
    v1: dict[str, CgroupMount] = field(default_factory=dict)


def _unescape(path: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and i + 4 <= len(path) and path[i + 1:i + 4].isdigit():
            out.append(chr(int(path[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> Mounts:
    """cgroup and cgroup2 mounts from ``/proc/self/mountinfo`` (first mount of each wins)."""
    v2: CgroupMount | None = None
    v1: dict[str, CgroupMount] = {}
    for raw in text.splitlines():
        left, sep, right = raw.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 1:
            continue
        mount = CgroupMount(_unescape(fields[3]), _unescape(fields[4]))
        fstype = tail[0]
        if fstype == "cgroup2" and v2 is None:
            v2 = mount
        elif fstype == "cgroup" and len(tail) >= 3:
            for option in tail[2].split(","):
                if option not in ("rw", "ro") and option not in v1 and "=" not in option:
                    v1[option] = mount
    return Mounts(v2, v1)


# -- discovery ------------------------------------------------------------------------------


def _join(mount: CgroupMount, path: str) -> Path:
    """The directory of cgroup ``path`` under ``mount`` (which may mount a sub-tree)."""
    root = mount.root.rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    elif root and path.startswith("/.."):
        path = "/"  # cgroup namespace edge: we can only see the mount itself
    return Path(mount.mountpoint) / path.lstrip("/")


@dataclass(frozen=True)
class CgroupPaths:
    """What this process can read. ``None`` means the file does not exist on this host."""

    layout: str                     # "unified", "hybrid" or "legacy" (no v2), "none"
    v2_dir: Path | None             # own cgroup v2 directory
    v1_memory_dir: Path | None      # own v1 memory cgroup (hybrid/legacy hosts)
    v1_cpu_dir: Path | None
    memory_pressure: Path | None
    cpu_pressure: Path | None

    @property
    def available(self) -> bool:
        return self.memory_pressure is not None

    def memory_limit_dir(self) -> tuple[str, Path] | None:
        """(``"v2"``|``"v1"``, dir) that sets the tightest memory limit, walking ancestors."""
        best: tuple[int, str, Path] | None = None
        if self.v2_dir is not None and (self.v2_dir / "memory.max").exists():
            for directory in _ancestors(self.v2_dir):
                limit = _read_limit(directory / "memory.max")
                if limit is not None and (best is None or limit < best[0]):
                    best = (limit, "v2", directory)
            if best is None:
                return ("v2", self.v2_dir)
        if best is None and self.v1_memory_dir is not None:
            for directory in _ancestors(self.v1_memory_dir):
                limit = _read_limit(directory / "memory.limit_in_bytes")
                if limit is not None and (best is None or limit < best[0]):
                    best = (limit, "v1", directory)
            if best is None:
                return ("v1", self.v1_memory_dir)
        return (best[1], best[2]) if best else None


def _ancestors(directory: Path) -> list[Path]:
    """``directory`` and its parents while they are still cgroup directories."""
    out = []
    current = directory
    while (current / "cgroup.procs").exists():
        out.append(current)
        if current.parent == current:
            break
        current = current.parent
    return out


def _read_limit(path: Path) -> int | None:
    try:
        return parse_limit(path.read_text())
    except OSError:
        return None


def discover(proc_cgroup: str | None = None, mountinfo: str | None = None) -> CgroupPaths:
    """Find this process's cgroups; the arguments default to ``/proc/self/*`` contents."""
    try:
        if proc_cgroup is None:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        if mountinfo is None:
            mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return CgroupPaths("none", None, None, None, None, None)
    own = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo)

    v2_dir = None
    if mounts.v2 is not None and own.v2_path is not None:
        candidate = _join(mounts.v2, own.v2_path)
        v2_dir = candidate if candidate.is_dir() else None

    def v1_dir(controller: str) -> Path | None:
        mount, path = mounts.v1.get(controller), own.v1_paths.get(controller)
        if mount is None or path is None:
            return None
        candidate = _join(mount, path)
        return candidate if candidate.is_dir() else None

    v1_memory, v1_cpu = v1_dir("memory"), v1_dir("cpu")
    layout = ("unified" if v2_dir and not mounts.v1 else "hybrid" if v2_dir
              else "legacy" if mounts.v1 else "none")

    def existing(directory: Path | None, name: str) -> Path | None:
        return directory / name if directory and (directory / name).exists() else None

    return CgroupPaths(layout, v2_dir, v1_memory, v1_cpu, existing(v2_dir, "memory.pressure"),
                       existing(v2_dir, "cpu.pressure"))


# -- samples --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemorySample:
    """``working_set`` is usage minus inactive file cache (what the kubelet evicts on):
    page cache that reclaim can drop is not a reason to panic."""

    usage: int
    working_set: int
    limit: int | None
    high: int | None
    events: dict[str, int]

    @property
    def ratio(self) -> float | None:
        """Working set as a fraction of the tightest of ``memory.high`` / the limit."""
        bounds = [b for b in (self.limit, self.high) if b]
        return self.working_set / min(bounds) if bounds else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_memory(paths: CgroupPaths) -> MemorySample | None:
    """Usage, limit and event counters from v2 files, else from the v1 memory controller."""
    where = paths.memory_limit_dir()
    if where is None:
        return None
    kind, directory = where
    if kind == "v2":
        current = _read(directory / "memory.current")
        if current is None:
            return None
        usage = int(current.strip() or 0)
        stat = parse_flat_keyed(_read(directory / "memory.stat") or "")
        events = parse_flat_keyed(_read(directory / "memory.events") or "")
        return MemorySample(usage, max(0, usage - stat.get("inactive_file", 0)),
                            parse_limit(_read(directory / "memory.max") or ""),
                            parse_limit(_read(directory / "memory.high") or ""), events)
    usage_text = _read(directory / "memory.usage_in_bytes")
    if usage_text is None:
        return None
    usage = int(usage_text.strip() or 0)
    stat = parse_flat_keyed(_read(directory / "memory.stat") or "")
    inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
    oom = parse_flat_keyed(_read(directory / "memory.oom_control") or "")
    failcnt = _read(directory / "memory.failcnt")
    # v1 has no memory.events: failcnt counts hits of the limit ("max"), oom_control the kills.
    events = {"max": int(failcnt.strip()) if failcnt and failcnt.strip().isdigit() else 0,
              "oom_kill": oom.get("oom_kill", 0)}
    limit = parse_limit(_read(directory / "memory.limit_in_bytes") or "")
    soft = parse_limit(_read(directory / "memory.soft_limit_in_bytes") or "")
    return MemorySample(usage, max(0, usage - inactive), limit, soft, events)


@dataclass(frozen=True)
class CpuSample:
    nr_periods: int
    nr_throttled: int
    throttled_us: int


def read_cpu(paths: CgroupPaths) -> CpuSample | None:
    """Throttling counters: v2 ``cpu.stat`` (``throttled_usec``) or v1 (``throttled_time`` ns)."""
    if paths.v2_dir is not None:
        stat = parse_flat_keyed(_read(paths.v2_dir / "cpu.stat") or "")
        if "nr_throttled" in stat:
            return CpuSample(stat.get("nr_periods", 0), stat["nr_throttled"],
                             stat.get("throttled_usec", 0))
    if paths.v1_cpu_dir is not None:
        stat = parse_flat_keyed(_read(paths.v1_cpu_dir / "cpu.stat") or "")
        if "nr_throttled" in stat:
            return CpuSample(stat.get("nr_periods", 0), stat["nr_throttled"],
                             stat.get("throttled_time", 0) // 1000)
    return None


def read_pressure(path: Path | None) -> Pressure | None:
    text = _read(path) if path is not None else None
    return parse_pressure(text) if text is not None else None


def describe(paths: CgroupPaths) -> dict[str, str | None]:
    """For the one log line at startup."""
    limit = paths.memory_limit_dir()
    return {"layout": paths.layout, "v2_dir": str(paths.v2_dir) if paths.v2_dir else None,
            "memory_limit_from": f"{limit[0]}:{limit[1]}" if limit else None,
            "pid": str(os.getpid())}
