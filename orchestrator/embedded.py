"""Throwaway local services for the demo and the tests: a PostgreSQL cluster from the local
server binaries, and an SQS-compatible moto server over HTTP. Both are real servers."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


class EmbeddedError(RuntimeError):
    """A local service could not be started; the message says what is missing."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_pg_bin() -> Path:
    """The directory with initdb/pg_ctl: $PHASEGATE_PG_BIN, PATH, or Debian's layout."""
    explicit = os.environ.get("PHASEGATE_PG_BIN")
    candidates = [explicit] if explicit else []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    candidates += sorted(glob.glob("/usr/local/pgsql/bin"))
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    raise EmbeddedError("no PostgreSQL server binaries found (initdb); install the "
                        "postgresql package or set PHASEGATE_PG_BIN, or give "
                        "PHASEGATE_DATABASE_URL")


@dataclass
class EmbeddedPostgres:
    """``initdb`` + ``pg_ctl start`` in a temp dir; as root, run as the ``postgres`` user
    (initdb refuses root)."""

    port: int = field(default_factory=free_port)
    data_dir: Path | None = None
    _owned_dir: str | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_server_user(self, argv: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return argv
        runuser = shutil.which("runuser")
        if runuser is None:
            raise EmbeddedError("running as root needs `runuser` to start PostgreSQL as the "
                                "postgres user")
        return [runuser, "-u", "postgres", "--", *argv]

    def start(self) -> EmbeddedPostgres:
        pg_bin = find_pg_bin()
        self._owned_dir = tempfile.mkdtemp(prefix="phasegate-pg-")
        self.data_dir = Path(self._owned_dir) / "data"
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise EmbeddedError("running as root needs a `postgres` OS user") from exc
            os.chown(self._owned_dir, user.pw_uid, user.pw_gid)
        run = self._run
        run([str(pg_bin / "initdb"), "-D", str(self.data_dir), "-U", "postgres",
             "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "-N"])
        run([str(pg_bin / "pg_ctl"), "-D", str(self.data_dir), "-w", "-l",
             str(Path(self._owned_dir) / "server.log"), "-o",
             f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self._owned_dir} "
             # fsync/full_page_writes off survive a process crash (the kernel keeps what was
             # written); synchronous_commit=off does NOT: `restart -m immediate` drops commits
             # already acknowledged (found by bench/chaos: a run row vanished after its start
             # message was sent, and the run restarted from a null input).
             "-c fsync=off -c full_page_writes=off "
             "-c max_connections=200", "start"])
        return self

    def restart(self, mode: str = "immediate") -> None:
        """``pg_ctl restart -m immediate``: a crash-like restart, for fault tests."""
        assert self.data_dir is not None
        pg_bin = find_pg_bin()
        self._run([str(pg_bin / "pg_ctl"), "-D", str(self.data_dir), "-w", "-m", mode,
                   "-l", str(Path(self._owned_dir or "") / "server.log"), "restart"])

    def stop(self) -> None:
        if self.data_dir is not None and self.data_dir.exists():
            pg_bin = find_pg_bin()
            subprocess.run(self._as_server_user(
                [str(pg_bin / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w",
                 "stop"]), capture_output=True, check=False)
        if self._owned_dir:
            shutil.rmtree(self._owned_dir, ignore_errors=True)
            self._owned_dir = None
            self.data_dir = None

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(self._as_server_user(argv), capture_output=True, text=True,
                              check=False, cwd="/")
        if done.returncode != 0:
            raise EmbeddedError(f"{Path(argv[0]).name} failed: "
                                f"{(done.stderr or done.stdout).strip()[-500:]}")

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class EmbeddedSqs:
    """moto's SQS server in a thread of this process, speaking HTTP on a free port."""

    port: int = field(default_factory=free_port)
    _server: object | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EmbeddedSqs:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError as exc:
            raise EmbeddedError("the local SQS server needs moto: pip install "
                                "'phasegate[demo]' (or 'moto[server]')") from exc
        import logging

        # One access-log line per SQS call would drown the demo's progress view.
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()  # type: ignore[attr-defined]
            self._server = None

    def __enter__(self) -> EmbeddedSqs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def local_aws_env() -> dict[str, str]:
    """Dummy credentials for a local SQS server; never used against AWS."""
    return {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
