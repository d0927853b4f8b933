"""Settings for every phasegate process, read from ``PHASEGATE_*`` environment variables.

One model serves the worker, the relay and the orchestrator; each command checks only the
fields it needs with :meth:`Settings.require`, so a relay does not demand a metrics port and
a worker does not demand the API host.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from typing import Literal, NoReturn
from urllib.parse import urlsplit

from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from phasegate.limits import (
    SQS_MAX_LONG_POLL_SECONDS,
    SQS_MAX_MESSAGE_BYTES,
    SQS_MAX_VISIBILITY_TIMEOUT_SECONDS,
)

ENV_PREFIX = "PHASEGATE_"


# RDS Proxy's endpoints (default and custom, commercial and China regions): a named
# statement that outlives its transaction pins the client connection to one server connection.
_RDS_PROXY_HOST = re.compile(r"\.proxy-[a-z0-9]+\.[a-z0-9-]+\.rds\.amazonaws\.com(\.cn)?$")
_PINS = ("PHASEGATE_DATABASE_POOLER={mode} keeps named statements, which pin every connection "
         "to one server connection behind RDS Proxy, and {where} is an RDS Proxy endpoint: use "
         "transaction there")


def is_rds_proxy(dsn: str) -> bool:
    """Whether ``dsn``'s host is an RDS Proxy endpoint (never echoes the DSN: it may hold a
    password)."""
    try:
        host = urlsplit(dsn).hostname or ""
    except ValueError:
        return False
    return bool(_RDS_PROXY_HOST.search(host.lower()))


class SettingsError(Exception):
    """A setting is missing or invalid; the message names the environment variable."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"invalid setting {variable}: {problem}")
        self.variable = variable
        self.problem = problem


class Settings(BaseSettings):
    """Every knob phasegate has. Field ``x`` is the env var ``PHASEGATE_X``."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # -- where things are
    database_url: str | None = None
    queue_url: str | None = None
    dlq_url: str | None = None
    sqs_endpoint_url: str | None = None
    aws_region: str | None = Field(
        default=None,
        description="Region for the SQS client; None falls back to the standard AWS chain.",
    )

    # -- what runs
    workflow_modules: str = ""
    concurrency: int = Field(default=4, ge=1, le=1000)
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")

    # -- the message lease
    visibility_timeout_s: int = Field(default=30, ge=1, le=SQS_MAX_VISIBILITY_TIMEOUT_SECONDS)
    heartbeat_s: float = Field(default=10.0, gt=0)
    wait_time_s: int = Field(default=20, ge=0, le=SQS_MAX_LONG_POLL_SECONDS)
    shutdown_grace_s: float = Field(default=20.0, ge=0)
    max_message_bytes: int = Field(default=SQS_MAX_MESSAGE_BYTES, ge=256, le=SQS_MAX_MESSAGE_BYTES)

    require_queue_encryption: bool = Field(
        default=False,
        description="Refuse to start a worker on a queue without SSE (SSE-SQS or a KMS key).")

    # -- failures inside a phase
    max_attempts: int = Field(default=5, ge=1, le=1000)
    retry_backoff_s: float = Field(default=2.0, ge=0)
    retry_backoff_max_s: float = Field(default=300.0, ge=0, le=SQS_MAX_VISIBILITY_TIMEOUT_SECONDS)
    # A phase still running after this long is cancelled and counts as a failed (retryable)
    # attempt, so a phase awaiting forever cannot hold its slot and its message forever.
    # An hour: longer than any phase we have seen, short enough that a hung call is noticed.
    # 0 = no limit; ``@wf.phase(name, timeout_s=...)`` overrides it per phase.
    phase_timeout_s: float = Field(default=3600.0, ge=0)
    # -- inside the room: a run resuming from a checkpoint older than this (database time)
    # re-fetches the versions of the resources it observed (phasegate/staleness.py).
    stale_after_s: float = Field(default=3600.0, ge=0)
    # -- branches (phasegate/branches.py): how deep ctx.fork may nest (1 = no fork inside a
    # branch) and how many branches of one run may be live at once; a fork beyond either
    # fails its phase with the reason, writing nothing.
    branch_max_depth: int = Field(default=3, ge=1, le=16)
    branch_max_live: int = Field(default=64, ge=1, le=10000)

    # -- database
    db_pool_min: int = Field(default=1, ge=0)
    db_pool_max: int = Field(default=4, ge=1)
    database_pooler: Literal["transaction", "pgbouncer", "none"] = Field(
        default="transaction",
        description="transaction: safe behind PgBouncer transaction mode / RDS Proxy (no "
        "named prepared statements); pgbouncer: behind PgBouncer in transaction mode or "
        "direct, never RDS Proxy, each query named by its text and prepared once per server "
        "connection; none: a direct connection, asyncpg's statement cache on.",
    )
    db_statement_cache_size: int = Field(
        default=100,
        ge=0,
        description="Queries kept per connection: named prepared statements with "
        "PHASEGATE_DATABASE_POOLER=none or pgbouncer; with transaction, each query's "
        "description (its types), so a query is one round trip (0: neither).",
    )
    db_connect_timeout_s: float = Field(default=10.0, gt=0)
    commit_batch_window_ms: float = Field(
        default=2.0, ge=0, le=50,
        description="group commit: a commit that finds another commit statement of the "
        "worker in flight waits at most this long to share the next statement; 0 = off.",
    )
    load_batch_window_ms: float = Field(
        default=2.0, ge=0, le=50,
        description="group load: the same for the check before each phase (load_for_phase); "
        "0 = off.",
    )

    # -- readiness on a cold start
    startup_timeout_s: float = Field(default=120.0, gt=0)

    # -- outbox relay
    relay_after_s: float = Field(default=5.0, ge=0)
    relay_interval_s: float = Field(default=1.0, gt=0)
    relay_batch: int = Field(default=100, ge=1, le=10_000)
    # A run idle this long although its next message was sent: that message is resent.
    relay_stall_after_s: float = Field(default=300.0, gt=0)
    # How long a relay's claim on the rows it is sending lasts: a relay that dies mid-send
    # leaves them to another relay after this. Longer than one SendMessageBatch can take.
    relay_claim_ttl_s: float = Field(default=30.0, gt=0)

    # -- local continuation (worker/continuation.py): after committing a phase, run the next
    # one in the same worker with the state in memory, at most this many hops / seconds per
    # received message before handing the run back to the queue.
    continuation: bool = True
    continuation_max_hops: int = Field(default=16, ge=1)
    continuation_max_s: float = Field(default=30.0, gt=0)
    # A plain successor that goes through SQS is committed as a short lease on the run's
    # position, not an outbox row, and sent by the worker (worker/continuation.py); off: an
    # outbox row, as for every other message.
    leased_send: bool = True

    # -- observability
    metrics_host: str = "0.0.0.0"
    metrics_port: int = Field(default=9100, ge=0, le=65535)

    # -- checkpoint-aware scale-in (the chart's worker.deletionCost)
    deletion_cost: bool = Field(default=False, description=(
        "Keep this pod's controller.kubernetes.io/pod-deletion-cost current (idle lowest, "
        "long uncommitted work highest) so a scale-in removes idle pods first."))
    deletion_cost_interval_s: float = Field(default=10.0, ge=1, description=(
        "Least seconds between two deletion-cost patches of the pod."))
    pod_name: str | None = Field(default=None, description=(
        "This worker's pod (downward API metadata.name); the deletion cost patches it."))
    pod_namespace: str | None = Field(default=None, description=(
        "This worker's namespace (downward API metadata.namespace)."))
    # -- worker presence (phasegate/presence.py): what the console's fleet page lists
    presence_interval_s: float = Field(default=15.0, ge=0, le=3600, description=(
        "How often a worker upserts its row in worker_presence (in flight, watchdog state), "
        "and at once on every watchdog state change; a row counts as live for two intervals. "
        "0: never (the fleet page then lists no workers)."))
    presence_retention_s: float = Field(default=3600.0, gt=0, description=(
        "The orchestrator deletes worker_presence rows not updated for this long (workers "
        "killed, scaled in or stopped). At least twice PHASEGATE_PRESENCE_INTERVAL_S."))
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"

    # -- governance (docs/concepts/governance.md): regional stores, read policy, retention
    stores: str | None = Field(
        default=None,
        description='JSON {"default": dsn, "<region>": dsn, ...}; unset: one store.',
    )
    read_policy: str | None = Field(
        default=None, description='JSON {"workflow.phase" | "workflow.*" | "*": [role, ...]}.')
    retention_by_classification: str | None = Field(
        default=None, description='JSON {"public": "7d", ...}: purge age per classification.')

    # -- control plane
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8080, ge=0, le=65535)
    api_auth: Literal["tokens", "kubernetes", "none"] = Field(
        default="tokens",
        description="Who may call /v1: bearer tokens from a file, Kubernetes ServiceAccounts "
                    "(TokenReview), or `none` (loopback only).")
    api_tokens_file: str | None = Field(
        default=None,
        description="File of `NAME ROLE[,ROLE] SHA256HEX` lines (tokens mode); re-read when "
                    "it changes.")
    api_service_accounts: str | None = Field(
        default=None,
        description='JSON {"namespace:serviceaccount": [role, ...]} (kubernetes mode).')
    api_max_body_bytes: int = Field(
        default=SQS_MAX_MESSAGE_BYTES, ge=1024, le=16 * 1024 * 1024,
        description="Largest request body the API reads; larger is 413 before parsing.")
    console_secure_cookie: Literal["auto", "true", "false"] = Field(
        default="auto",
        description="The console's login cookie carries `Secure`: `auto` when the request "
                    "came over https (also behind a proxy setting `X-Forwarded-Proto`), "
                    "`true` always, `false` never (plain-http port-forwards).")

    # -- schedules (docs/how-to/schedules.md): fired by the orchestrator
    schedules: str | None = Field(
        default=None,
        description='JSON [{"workflow": ..., "cron": ..., "input": ..., "name": ...}]: '
                    "schedules of workflows the orchestrator does not load.")
    schedule_catchup: Literal["none", "latest", "all"] = Field(
        default="latest",
        description="Ticks missed while no orchestrator ran: start none, the latest only, or "
                    "all (at most schedule_catchup_max).")
    schedule_catchup_max: int = Field(default=10, ge=1, le=1000, description=(
        "With schedule_catchup=all: at most this many missed ticks per schedule are started "
        "(the newest)."))
    schedule_interval_s: float = Field(default=5.0, gt=0, le=60, description=(
        "Seconds between two scans of the schedules (a tick fires at most this late)."))

    # -- TEST ONLY: kill the process at named points (see phasegate/faults.py). Off by default.
    faults: str = ""
    fault_seed: int = 0

    @field_validator("log_level", "log_format", "api_auth", "console_secure_cookie",
                     "schedule_catchup", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("worker_id")
    @classmethod
    def _worker_id(cls, value: str) -> str:
        # A lease holder is the worker id, or the id with store.SENT_SUFFIX ("/sent").
        if not value or "/" in value:
            raise ValueError("must be non-empty and contain no '/'")
        return value

    @field_validator("database_url")
    @classmethod
    def _postgres_scheme(cls, value: str | None) -> str | None:
        if value and not value.startswith(("postgres://", "postgresql://")):
            raise ValueError("must start with postgresql:// or postgres://")
        return value

    @field_validator("database_pooler")
    @classmethod
    def _pooler_fits_the_host(cls, value: str, info: ValidationInfo) -> str:
        database_url = info.data.get("database_url")
        if value != "transaction" and database_url and is_rds_proxy(database_url):
            raise ValueError(_PINS.format(mode=value, where="PHASEGATE_DATABASE_URL"))
        return value

    @field_validator("queue_url", "dlq_url", "sqs_endpoint_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return value

    @field_validator("stores")
    @classmethod
    def _stores(cls, value: str | None, info: ValidationInfo) -> str | None:
        from phasegate.residency import parse_stores

        if value:
            default = parse_stores(value).get("default")
            database_url = info.data.get("database_url")
            if default and database_url and default != database_url:
                raise ValueError("its default store differs from PHASEGATE_DATABASE_URL; "
                                 "set one of them, or both to the same DSN")
            pooler = info.data.get("database_pooler", "transaction")
            if pooler != "transaction" and any(
                    is_rds_proxy(dsn) for dsn in parse_stores(value).values()):
                raise ValueError(_PINS.format(mode=pooler, where="a store"))
        return value or None

    @field_validator("schedules")
    @classmethod
    def _schedules(cls, value: str | None) -> str | None:
        from phasegate.schedules import ScheduleError, parse_schedules

        try:
            parse_schedules(value)
        except ScheduleError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("read_policy")
    @classmethod
    def _read_policy(cls, value: str | None) -> str | None:
        from phasegate.access import parse_policy

        if value:
            parse_policy(value)
        return value or None

    @field_validator("api_service_accounts")
    @classmethod
    def _service_accounts(cls, value: str | None) -> str | None:
        from phasegate.access import parse_service_accounts

        if value:
            parse_service_accounts(value)
        return value or None

    @field_validator("retention_by_classification")
    @classmethod
    def _retention(cls, value: str | None) -> str | None:
        from phasegate.retention import parse_retention

        if value:
            parse_retention(value)
        return value or None

    @model_validator(mode="before")
    @classmethod
    def _default_store(cls, values: object) -> object:
        """``PHASEGATE_STORES``'s default is the database when DATABASE_URL is unset."""
        if isinstance(values, dict) and not values.get("database_url") and values.get("stores"):
            from phasegate.residency import parse_stores

            try:
                default = parse_stores(str(values["stores"])).get("default")
            except ValueError:
                return values  # the field validator reports it, naming PHASEGATE_STORES
            if default:
                values = {**values, "database_url": default}
        return values

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.heartbeat_s >= self.visibility_timeout_s:
            raise ValueError(
                "heartbeat_s must be shorter than visibility_timeout_s "
                f"({self.heartbeat_s} >= {self.visibility_timeout_s})"
            )
        if self.db_pool_min > self.db_pool_max:
            raise ValueError("db_pool_min must not exceed db_pool_max")
        if self.presence_retention_s < 2 * self.presence_interval_s:
            # A live worker's row would be purged between two of its reports.
            raise ValueError("presence_retention_s must be at least twice presence_interval_s "
                             f"({self.presence_retention_s} < 2 * {self.presence_interval_s})")
        return self

    @property
    def store_map(self) -> dict[str, str]:
        """Region -> DSN for every configured store (``default`` included when known)."""
        from phasegate.residency import DEFAULT_REGION, parse_stores

        stores = parse_stores(self.stores) if self.stores else {}
        if self.database_url:
            stores.setdefault(DEFAULT_REGION, self.database_url)
        return stores

    @property
    def module_list(self) -> list[str]:
        return [m.strip() for m in self.workflow_modules.split(",") if m.strip()]

    def require(self, *fields: str) -> Settings:
        """Fail with a SettingsError naming the first of ``fields`` that is unset."""
        for name in fields:
            if getattr(self, name) in (None, ""):
                raise SettingsError(env_name(name), "is required but not set")
        return self


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment, turning pydantic's report into a SettingsError."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first.get("loc") or ()
        field = str(loc[0]) if loc else ""
        variable = env_name(field) if field else f"{ENV_PREFIX}*"
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise SettingsError(variable, message) from None


def exit_on_settings_error(error: SettingsError) -> NoReturn:
    """The contract for a bad setting: one line naming the variable, exit status 2."""
    print(f"phasegate: {error}", file=sys.stderr)
    raise SystemExit(2)
