"""The memory-pressure watchdog: a daemon thread that watches cgroup signals.

Signals, in the order they usually warn:

- **PSI trigger** on ``memory.pressure`` (``some <stall_us> <window_us>``), woken with
  POLLPRI. Without CAP_SYS_RESOURCE the kernel accepts only windows that are multiples of
  2 s; when registration is refused (EINVAL, read-only cgroupfs, old kernel) the thread
  polls the same file instead and applies the same stall budget to ``total`` deltas, plus
  an ``avg10`` threshold.
- **Headroom**: the working set (usage minus inactive file cache) against ``memory.high`` /
  the limit. A fast heap spike produces no PSI event at all before the OOM kill, so this is
  the only warning that case can get, and only if a sample lands in time. On a host
  without PSI (cgroup v1) but with a memory limit, headroom is polled alone.
- **memory.events** increments (``high``, ``max``; ``oom_kill`` is counted, too late to act).
- **CPU throttling** (``cpu.stat``) and ``cpu.pressure``: metrics only, a leading indicator.

The thread never touches asyncio objects: it hands every event to the event loop with
``loop.call_soon_threadsafe``. Correctness never depends on it; it only shortens the work a
kill can cost.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Literal

import structlog
from prometheus_client import Counter, Gauge
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from phasegate.worker import cgroups
from phasegate.worker.cgroups import CgroupPaths, MemorySample

log = structlog.get_logger("phasegate.watchdog")

# PSI trigger windows the kernel accepts (kernel/sched/psi.c: 500 ms .. 10 s); without
# CAP_SYS_RESOURCE only multiples of 2 s (measured on these machines: 1 s -> EINVAL).
PSI_MIN_WINDOW_US = 500_000
PSI_MAX_WINDOW_US = 10_000_000
PSI_UNPRIVILEGED_WINDOW_STEP_US = 2_000_000

AVAILABLE = Gauge("phasegate_watchdog_available",
                  "1 when the memory watchdog runs (PSI and/or headroom against a memory "
                  "limit), 0 when it stood down.")
MODE = Gauge("phasegate_watchdog_psi_trigger",
             "1 when a PSI trigger is registered (POLLPRI), 0 when memory.pressure is polled.")
MEMORY_PRESSURE = Gauge("phasegate_memory_pressure_ratio",
                        "memory.pressure avg10 as a ratio (0..1).", ["kind"])
CPU_PRESSURE = Gauge("phasegate_cpu_pressure_ratio", "cpu.pressure avg10 as a ratio (0..1).",
                     ["kind"])
WORKING_SET = Gauge("phasegate_memory_working_set_bytes",
                    "cgroup memory usage minus inactive file cache.")
MEMORY_LIMIT = Gauge("phasegate_memory_limit_bytes",
                     "Tightest of memory.high and the limit (0 when unlimited).")
HEADROOM = Gauge("phasegate_memory_headroom_ratio", "Working set / limit (0 when unlimited).")
MEMORY_EVENTS = Counter("phasegate_memory_events_total",
                        "Increments of memory.events seen by the watchdog.", ["event"])
CPU_THROTTLED = Counter("phasegate_cpu_throttled_periods_total",
                        "CFS periods in which the cgroup was throttled (cpu.stat).")
CPU_THROTTLED_SECONDS = Counter("phasegate_cpu_throttled_seconds_total",
                                "Time the cgroup was throttled (cpu.stat).")
UNDER_PRESSURE = Gauge("phasegate_memory_pressure_active",
                       "1 while the watchdog holds the worker in its reduced mode.")


class WatchdogSettings(BaseSettings):
    """Thresholds of the watchdog. Field ``x`` is ``PHASEGATE_WATCHDOG_X``."""

    model_config = SettingsConfigDict(env_prefix="PHASEGATE_WATCHDOG_", extra="ignore",
                                      frozen=True)

    enabled: bool = True
    psi_trigger: bool = Field(default=True, description=(
        "Register a PSI trigger (POLLPRI); false always polls memory.pressure instead."))
    psi_stall_us: int = Field(default=50_000, gt=0, description=(
        "Stall budget per window for the 'some' trigger (50 ms per 2 s = 2.5 %)."))
    psi_window_us: int = Field(default=2_000_000, ge=PSI_MIN_WINDOW_US, le=PSI_MAX_WINDOW_US)
    poll_avg10_percent: float = Field(default=10.0, gt=0, le=100, description=(
        "Polling fallback also fires when memory.pressure some avg10 reaches this."))
    headroom_ratio: float = Field(default=0.90, gt=0, le=1, description=(
        "Flush when the working set reaches this fraction of memory.high / the limit."))
    release_headroom_ratio: float = Field(default=0.80, gt=0, le=1)
    memory_events: str = Field(default="high", description=(
        "memory.events counters whose increments trigger a flush (comma list of high, max). "
        "'max' also counts routine page-cache reclaim at the limit, so it is off by default."))
    release_stall_us: int = Field(default=10_000, ge=0, description=(
        "Pressure is over when stalls per window stay below this ..."))
    release_after_s: float = Field(default=10.0, ge=0, description="... for this long.")
    sample_interval_s: float = Field(default=0.25, gt=0, le=10, description=(
        "How often headroom, memory.events and cpu.stat are read."))
    reflush_interval_s: float = Field(default=5.0, ge=0, description=(
        "While pressure lasts, flush again (fresher progress) at most this often."))
    reduced_concurrency: int = Field(default=1, ge=0, description=(
        "Concurrency while under pressure; 0 keeps receiving paused until release."))

    @property
    def memory_event_triggers(self) -> frozenset[str]:
        return frozenset(e.strip() for e in self.memory_events.split(",") if e.strip())

    @model_validator(mode="after")
    def _consistent(self) -> WatchdogSettings:
        unknown = self.memory_event_triggers - {"high", "max"}
        if unknown:
            raise ValueError(f"memory_events: unknown {sorted(unknown)} (use high, max)")
        if self.psi_stall_us >= self.psi_window_us:
            raise ValueError("psi_stall_us must be shorter than psi_window_us")
        if self.release_headroom_ratio > self.headroom_ratio:
            raise ValueError("release_headroom_ratio must not exceed headroom_ratio")
        return self


Reason = Literal["psi_trigger", "psi_poll", "headroom", "memory_high", "memory_max"]


@dataclass(frozen=True)
class PressureEvent:
    """Handed to the loop. ``kind`` is ``pressure``, ``release`` or ``crashed``."""

    kind: Literal["pressure", "release", "crashed"]
    reason: str
    at: float = field(default_factory=time.time)  # wall clock, for logs and the bench
    detail: dict[str, float] = field(default_factory=dict)


class Watchdog(threading.Thread):
    """Daemon thread; ``start()`` with the worker, ``stop()`` when it stops."""

    def __init__(self, settings: WatchdogSettings, paths: CgroupPaths,
                 loop: asyncio.AbstractEventLoop,
                 callback: Callable[[PressureEvent], None]) -> None:
        super().__init__(name="phasegate-watchdog", daemon=True)
        self.settings = settings
        self.paths = paths
        self._loop = loop
        self._callback = callback
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._trigger_fd: int | None = None
        self._stalls: deque[tuple[float, int]] = deque()
        self._events: dict[str, int] | None = None
        self._cpu: cgroups.CpuSample | None = None
        self._pressured = False
        self._calm_since: float | None = None
        self._last_pressure_sent = 0.0
        self.samples = 0

    # -- lifecycle (called from the loop thread) -----------------------------------------------

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        with suppress(OSError):
            os.write(self._wake_w, b"x")
        if self.is_alive():
            self.join(timeout)
        for fd in (self._wake_r, self._wake_w):
            with suppress(OSError):
                os.close(fd)

    def register_trigger(self) -> bool:
        """Register the PSI trigger; False (and the reason logged) when the kernel refuses."""
        path = self.paths.memory_pressure
        if path is None:
            return False
        spec = f"some {self.settings.psi_stall_us} {self.settings.psi_window_us}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        except OSError as exc:
            log.info("psi_trigger_unavailable_polling", path=str(path), trigger=spec,
                     error=errno.errorcode.get(exc.errno or 0, str(exc)))
            return False
        try:
            os.write(fd, spec.encode() + b"\0")
        except OSError as exc:
            os.close(fd)
            hint = ("windows must be multiples of 2 s without CAP_SYS_RESOURCE"
                    if exc.errno == errno.EINVAL else None)
            log.info("psi_trigger_refused_polling", path=str(path), trigger=spec,
                     error=errno.errorcode.get(exc.errno or 0, str(exc)), hint=hint)
            return False
        self._trigger_fd = fd
        return True

    # -- the thread -------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a bug: tell the loop, which stops the worker loudly
            self._send(PressureEvent("crashed", f"{type(exc).__name__}: {exc}"[:300]))
        finally:
            if self._trigger_fd is not None:
                os.close(self._trigger_fd)
                self._trigger_fd = None

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        if self._trigger_fd is not None:
            poller.register(self._trigger_fd, select.POLLPRI)
        interval_ms = max(1, int(self.settings.sample_interval_s * 1000))
        while not self._stopping.is_set():
            ready = poller.poll(interval_ms)
            if self._stopping.is_set():
                return
            now = time.monotonic()
            for fd, mask in ready:
                if fd == self._trigger_fd and mask & select.POLLERR:
                    # The cgroup went away under us; keep watching by polling.
                    poller.unregister(fd)
                    os.close(fd)
                    self._trigger_fd = None
                elif fd == self._trigger_fd and mask & select.POLLPRI:
                    self._pressure("psi_trigger", now, {})
            self.sample(now)

    def sample(self, now: float) -> None:
        """One look at every signal; also the whole polling fallback."""
        pressure = cgroups.read_pressure(self.paths.memory_pressure)
        stall_in_window = 0
        if pressure is not None and pressure.some is not None:
            MEMORY_PRESSURE.labels("some").set(pressure.some.avg10 / 100)
            if pressure.full is not None:
                MEMORY_PRESSURE.labels("full").set(pressure.full.avg10 / 100)
            stall_in_window = self._stall_in_window(now, pressure.some.total_us)
            if self._trigger_fd is None and (
                    stall_in_window >= self.settings.psi_stall_us
                    or pressure.some.avg10 >= self.settings.poll_avg10_percent):
                self._pressure("psi_poll", now, {"stall_us": stall_in_window,
                                                 "avg10": pressure.some.avg10})
        cpu_pressure = cgroups.read_pressure(self.paths.cpu_pressure)
        if cpu_pressure is not None and cpu_pressure.some is not None:
            CPU_PRESSURE.labels("some").set(cpu_pressure.some.avg10 / 100)
        self._sample_cpu()
        memory = cgroups.read_memory(self.paths)
        ratio = self._sample_memory(now, memory)
        self._maybe_release(now, stall_in_window, ratio)
        self.samples += 1

    def _stall_in_window(self, now: float, total_us: int) -> int:
        window_s = self.settings.psi_window_us / 1e6
        self._stalls.append((now, total_us))
        while len(self._stalls) > 1 and self._stalls[1][0] <= now - window_s:
            self._stalls.popleft()
        return max(0, total_us - self._stalls[0][1])

    def _sample_memory(self, now: float, memory: MemorySample | None) -> float | None:
        if memory is None:
            return None
        WORKING_SET.set(memory.working_set)
        bounds = [b for b in (memory.limit, memory.high) if b]
        MEMORY_LIMIT.set(min(bounds) if bounds else 0)
        ratio = memory.ratio
        HEADROOM.set(ratio or 0)
        if self._events is not None:
            for name, value in memory.events.items():
                delta = value - self._events.get(name, 0)
                if delta > 0:
                    MEMORY_EVENTS.labels(name).inc(delta)
                    if name in self.settings.memory_event_triggers:
                        self._pressure(f"memory_{name}", now, {"increment": delta})
        self._events = dict(memory.events)
        if ratio is not None and ratio >= self.settings.headroom_ratio:
            self._pressure("headroom", now, {"ratio": round(ratio, 4),
                                             "working_set": memory.working_set})
        return ratio

    def _sample_cpu(self) -> None:
        cpu = cgroups.read_cpu(self.paths)
        if cpu is None:
            return
        if self._cpu is not None:
            if cpu.nr_throttled > self._cpu.nr_throttled:
                CPU_THROTTLED.inc(cpu.nr_throttled - self._cpu.nr_throttled)
            if cpu.throttled_us > self._cpu.throttled_us:
                CPU_THROTTLED_SECONDS.inc((cpu.throttled_us - self._cpu.throttled_us) / 1e6)
        self._cpu = cpu

    # -- hysteresis ---------------------------------------------------------------------------

    def _pressure(self, reason: str, now: float, detail: dict[str, float]) -> None:
        self._calm_since = None
        first = not self._pressured
        self._pressured = True
        UNDER_PRESSURE.set(1)
        # While pressure lasts, tell the loop again at most every reflush interval.
        if first or now - self._last_pressure_sent >= self.settings.reflush_interval_s:
            self._last_pressure_sent = now
            self._send(PressureEvent("pressure", reason, detail=detail))

    def _maybe_release(self, now: float, stall_in_window: int, ratio: float | None) -> None:
        if not self._pressured:
            return
        calm = (stall_in_window <= self.settings.release_stall_us
                and (ratio is None or ratio < self.settings.release_headroom_ratio))
        if not calm:
            self._calm_since = None
            return
        if self._calm_since is None:
            self._calm_since = now
        if now - self._calm_since >= self.settings.release_after_s:
            self._pressured = False
            self._calm_since = None
            UNDER_PRESSURE.set(0)
            self._send(PressureEvent("release", "calm", detail={
                "stall_us": stall_in_window, "ratio": ratio or 0.0}))

    def _send(self, event: PressureEvent) -> None:
        try:
            self._loop.call_soon_threadsafe(self._callback, event)
        except RuntimeError:  # the loop closed: the worker is gone, so are we
            self._stopping.set()


def start_watchdog(settings: WatchdogSettings, loop: asyncio.AbstractEventLoop,
                   callback: Callable[[PressureEvent], None],
                   paths: CgroupPaths | None = None) -> Watchdog | None:
    """Discover cgroups and start the thread; None (said once, metric 0) when unavailable."""
    if not settings.enabled:
        AVAILABLE.set(0)
        log.info("watchdog_disabled", setting="PHASEGATE_WATCHDOG_ENABLED")
        return None
    paths = paths or cgroups.discover()
    if not paths.available and not _has_memory_limit(paths):
        AVAILABLE.set(0)
        log.warning("watchdog_standing_down",
                    reason="no cgroup v2 memory.pressure (PSI) and no memory limit to "
                           "measure headroom against for this process",
                    **cgroups.describe(paths))
        return None
    watchdog = Watchdog(settings, paths, loop, callback)
    trigger = settings.psi_trigger and watchdog.register_trigger()
    MODE.set(1 if trigger else 0)
    AVAILABLE.set(1)
    UNDER_PRESSURE.set(0)
    watchdog.start()
    if paths.available:
        log.info("watchdog_started", psi_trigger=trigger, signals="psi,headroom",
                 trigger=f"some {settings.psi_stall_us} {settings.psi_window_us}",
                 headroom_ratio=settings.headroom_ratio, **cgroups.describe(paths))
    else:
        # A cgroup v1 host (Docker on an older distribution, some CI runners): no PSI, but
        # the v1 limit and usage are there. Headroom is the only warning a fast heap spike
        # gives anyway, so polling it is worth running alone.
        log.warning("watchdog_headroom_only", signals="headroom",
                    reason="no cgroup v2 memory.pressure (PSI) for this process",
                    headroom_ratio=settings.headroom_ratio, **cgroups.describe(paths))
    return watchdog


def _has_memory_limit(paths: CgroupPaths) -> bool:
    """True when usage can be read against a finite limit (v2 ``memory.max`` or v1)."""
    memory = cgroups.read_memory(paths)
    return memory is not None and memory.ratio is not None
