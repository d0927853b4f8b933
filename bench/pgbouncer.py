"""Debian's PgBouncer in transaction mode in front of a PostgreSQL server, for tests and benches.

``PgBouncer(upstream_port)`` writes a config into a temp dir, starts ``pgbouncer`` on a free
port (as the ``postgres`` OS user when run as root: PgBouncer refuses root) and stops it on
exit. Every database name is routed (``* =`` fallback), so per-test databases cloned from a
template work without reconfiguring. Trust auth, like the test server behind it.

The server side is deliberately small — ``server_pool`` (6) server connections per database
— so a fleet of clients really shares a few server connections and any session state leaking
from one transaction to the next shows up as an error.

If the binary is missing and we are root, ``apt-get install pgbouncer`` (Debian bookworm ships
1.18, which has no ``max_prepared_statements``: named prepared statements fail through it).

``root``: a directory holding a Debian root file system with a newer PgBouncer
(``scripts/pgbouncer-current.sh`` builds one with Debian trixie's 1.24, whose
``max_prepared_statements`` is on by default); PgBouncer then runs there under ``chroot``, its
config and log in the root's ``/tmp``. ``PHASEGATE_PGBOUNCER_ROOT`` names one for every
PgBouncer a test or bench starts without a ``root`` of its own.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from phasegate.orchestrator.embedded import free_port

BINARY_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")
SERVER_POOL = 6
START_TIMEOUT_S = 20.0
ROOT_ENV = "PHASEGATE_PGBOUNCER_ROOT"


class PgBouncerError(RuntimeError):
    """PgBouncer is not installed and cannot be, or did not start."""


def find_pgbouncer(install: bool = True) -> str:
    """The pgbouncer binary; apt-installs Debian's package as root if it is missing."""
    found = shutil.which("pgbouncer") or next(
        (c for c in BINARY_CANDIDATES if os.access(c, os.X_OK)), None)
    if found:
        return found
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PgBouncerError("pgbouncer is not installed: `apt-get install pgbouncer` "
                             "(as root) or put it on PATH")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(["apt-get", "install", "-y", "-q", "pgbouncer"], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        # A fresh machine may have no package lists yet.
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
        done = subprocess.run(["apt-get", "install", "-y", "-q", "pgbouncer"], env=env,
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PgBouncerError(f"apt-get install pgbouncer failed: {done.stderr.strip()[-300:]}")
    return find_pgbouncer(install=False)


def current_root() -> str:
    """The root file system holding the current PgBouncer (``scripts/pgbouncer-current.sh``),
    built on first use."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "pgbouncer-current.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PgBouncerError(f"scripts/pgbouncer-current.sh failed: {done.stderr.strip()[-500:]}")
    return done.stdout.strip().splitlines()[-1]


def config_text(*, listen_port: int, upstream_host: str, upstream_port: int, workdir: str,
                server_pool: int = SERVER_POOL, extra: dict[str, str] | None = None) -> str:
    """The config file; ``extra`` adds or replaces ``[pgbouncer]`` settings (a test's
    ``server_reset_query``)."""
    lines = [
        "[databases]",
        f"* = host={upstream_host} port={upstream_port}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {listen_port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {workdir}/userlist.txt",
        "pool_mode = transaction",
        f"default_pool_size = {server_pool}",
        f"max_db_connections = {server_pool}",
        "min_pool_size = 0",
        "reserve_pool_size = 0",
        "max_client_conn = 2000",
        # A client waits for a free server connection instead of failing, as in production.
        "query_wait_timeout = 60",
        "server_reset_query =",
        # After a failed server login PgBouncer waits this long before trying again (15 s by
        # default): a database restart would stall every client for that long.
        "server_login_retry = 1",
        "ignore_startup_parameters = extra_float_digits",
        f"logfile = {workdir}/pgbouncer.log",
        f"pidfile = {workdir}/pgbouncer.pid",
        "log_connections = 0",
        "log_disconnections = 0",
    ]
    for name, value in (extra or {}).items():
        lines = [line for line in lines if not line.startswith(f"{name} =")]
        lines.append(f"{name} = {value}")
    return "\n".join([*lines, ""])


class PgBouncer:
    """A running PgBouncer (transaction mode) in front of ``upstream_host:upstream_port``."""

    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1",
                 server_pool: int = SERVER_POOL, extra: dict[str, str] | None = None,
                 root: str | None = None) -> None:
        self.root = root if root is not None else (os.environ.get(ROOT_ENV) or None)
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.server_pool = server_pool
        self.extra = extra or {}
        self.port = free_port()
        self._version: str | None = None
        self._workdir: str | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    def in_front_of(cls, dsn: str, **kwargs: Any) -> PgBouncer:
        parts = urlsplit(dsn)
        return cls(parts.port or 5432, upstream_host=parts.hostname or "127.0.0.1", **kwargs)

    def route(self, dsn: str) -> str:
        """The same DSN (user, database) through this PgBouncer."""
        parts = urlsplit(dsn)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def _command(self) -> list[str]:
        """How to run PgBouncer: the host's binary, or the root's under chroot."""
        if self.root is None:
            return [find_pgbouncer()]
        if os.geteuid() != 0 or not os.access(Path(self.root) / "usr/sbin/pgbouncer", os.X_OK):
            raise PgBouncerError(f"{ROOT_ENV}={self.root}: needs root and a root file system "
                                 "with /usr/sbin/pgbouncer (scripts/pgbouncer-current.sh)")
        return ["chroot", self.root, "/usr/sbin/pgbouncer"]

    def version(self) -> str:
        """``PgBouncer 1.24.1``: the first line of ``pgbouncer --version``."""
        if self._version is None:
            done = subprocess.run([*self._command(), "--version"], capture_output=True,
                                  text=True, check=True)
            self._version = done.stdout.splitlines()[0].strip()
        return self._version

    @property
    def tracks_prepared_statements(self) -> bool:
        """Whether this PgBouncer keeps track of each client's named statements itself
        (``max_prepared_statements`` above 0: 1.21 and later, and on by default since 1.24)."""
        numbers = tuple(int(n) for n in self.version().split()[1].split(".")[:2])
        if numbers < (1, 21):
            return False
        default = "200" if numbers >= (1, 24) else "0"
        return int(self.extra.get("max_prepared_statements", default)) > 0

    def start(self) -> PgBouncer:
        command = self._command()
        host_tmp = Path(self.root) / "tmp" if self.root is not None else None
        self._workdir = tempfile.mkdtemp(prefix="phasegate-pgbouncer-", dir=host_tmp)
        workdir = Path(self._workdir)
        # The paths PgBouncer itself sees: under chroot, relative to its root.
        seen = "/" + str(workdir.relative_to(self.root)) if self.root else self._workdir
        (workdir / "userlist.txt").write_text('"postgres" ""\n')
        config = workdir / "pgbouncer.ini"
        config.write_text(config_text(listen_port=self.port, upstream_host=self.upstream_host,
                                      upstream_port=self.upstream_port, workdir=seen,
                                      server_pool=self.server_pool, extra=self.extra))
        argv = [*command, f"{seen}/pgbouncer.ini"]
        if os.geteuid() == 0:
            # Refuses to run as root; the root file system has its own postgres user.
            passwd = Path(self.root or "/") / "etc/passwd"
            uid, gid = _user_ids(passwd, "postgres")
            for path in (workdir, *workdir.iterdir()):
                os.chown(path, uid, gid)
            argv = [*command, "-u", "postgres", f"{seen}/pgbouncer.ini"]
        self._process = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, cwd="/")
        self._wait_listening()
        return self

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise PgBouncerError(f"pgbouncer exited {self._process.returncode}: "
                                     f"{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise PgBouncerError(f"pgbouncer did not listen within {START_TIMEOUT_S:g}s: "
                             f"{self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        if self._workdir is None:
            return ""
        log = Path(self._workdir) / "pgbouncer.log"
        stderr = b""
        if self._process is not None and self._process.poll() is not None and \
                self._process.stderr is not None:
            stderr = self._process.stderr.read()
        text = (log.read_text(errors="replace") if log.exists() else "") + stderr.decode(
            errors="replace")
        return text[-chars:]

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _user_ids(passwd: Path, name: str) -> tuple[int, int]:
    """A user's uid and gid from a passwd file (the host's, or a chroot's own)."""
    if passwd == Path("/etc/passwd"):
        entry = pwd.getpwnam(name)
        return entry.pw_uid, entry.pw_gid
    for line in passwd.read_text().splitlines():
        fields = line.split(":")
        if fields[0] == name:
            return int(fields[2]), int(fields[3])
    raise PgBouncerError(f"no {name} user in {passwd}")
