"""The orchestrator process: the HTTP API, the outbox relay, the queue-depth exporter, the
purge of stale worker presence rows and (when schedules are defined) the scheduler on one
event loop.

They run as supervised tasks: if one of them ends with an error the others are stopped
and the process exits non-zero (loudly), never with a side task silently gone. ``stop()`` (on
SIGTERM) stops them all; the process then exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass

import structlog
import uvicorn

from phasegate.access import policy_from
from phasegate.batcher import MARK_SENT_LINGER_S, MARKS_PER_CALL, MicroBatcher
from phasegate.db import pool_from_settings
from phasegate.orchestrator.api import Services, create_app
from phasegate.orchestrator.auth import Authenticator, authenticator_from
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.exporter import QueueDepthExporter
from phasegate.orchestrator.fleet import FleetView
from phasegate.orchestrator.presence_purge import PresencePurger
from phasegate.orchestrator.relay import Relay
from phasegate.orchestrator.scheduler import Scheduler, schedules_for
from phasegate.queue import SqsQueue
from phasegate.residency import DEFAULT_REGION, StoreRouter, stores_from_settings
from phasegate.schedules import Schedule, ScheduleError
from phasegate.settings import Settings, SettingsError
from phasegate.store import Store
from phasegate.workflow import Registry

log = structlog.get_logger("phasegate.orchestrator")

# Side tasks that run until cancelled, cancelled once every other task has ended.
STOPPED_LAST = ("mark_sent",)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the orchestrator owns SIGTERM (and uvicorn
    would re-raise the signal after shutdown, turning a clean stop into a non-zero exit)."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_started = on_started

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_started()


@dataclass(frozen=True)
class OrchestratorOptions:
    host: str
    port: int
    relay: bool = True
    exporter_interval_s: float = 5.0
    fleet_deployment: str | None = None
    fleet_namespace: str | None = None


class Orchestrator:
    def __init__(self, settings: Settings, registry: Registry,
                 options: OrchestratorOptions) -> None:
        self.settings = settings
        self.registry = registry
        self.options = options
        self.port: int | None = None
        self.started = asyncio.Event()
        self._stop = asyncio.Event()
        self._server: _Server | None = None
        self._relay: Relay | None = None
        self._regional_relays: list[Relay] = []  # one per extra store of PHASEGATE_STORES
        self._exporter: QueueDepthExporter | None = None
        self._scheduler: Scheduler | None = None
        self._presence_purger: PresencePurger | None = None
        self._auth: Authenticator | None = None

    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.port}"

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._relay is not None:
            self._relay.stop()
        for relay in self._regional_relays:
            relay.stop()
        if self._exporter is not None:
            self._exporter.stop()
        if self._scheduler is not None:
            self._scheduler.stop()
        if self._presence_purger is not None:
            self._presence_purger.stop()

    def authenticator(self) -> Authenticator:
        """Who may call /v1 (PHASEGATE_API_AUTH); a SettingsError when it cannot be built,
        so the orchestrator refuses to start rather than serve an open API."""
        if self._auth is not None:
            return self._auth
        settings = self.settings
        try:
            self._auth = authenticator_from(
                mode=settings.api_auth, tokens_file=settings.api_tokens_file,
                service_accounts=settings.api_service_accounts, host=self.options.host)
        except ValueError as exc:
            variable = "PHASEGATE_API_TOKENS_FILE" if settings.api_auth == "tokens" \
                else "PHASEGATE_API_AUTH"
            raise SettingsError(variable, str(exc)) from None
        return self._auth

    def schedules(self) -> list[Schedule]:
        """What this orchestrator fires; a SettingsError (exit 2) before anything starts."""
        try:
            return schedules_for(self.registry, self.settings.schedules)
        except ScheduleError as exc:
            raise SettingsError("PHASEGATE_SCHEDULES", str(exc)) from None

    async def run(self) -> None:
        settings = self.settings
        auth = self.authenticator()
        schedules = self.schedules()
        pool = await pool_from_settings(settings, min_size=1,
                                        max_size=max(2, settings.db_pool_max))
        fleet = FleetView.from_environment(deployment=self.options.fleet_deployment,
                                           namespace=self.options.fleet_namespace)
        regional_pools = contextlib.AsyncExitStack()
        try:
            # Residency (docs/concepts/governance.md): with PHASEGATE_STORES, runs are found in the
            # store that holds them, and every store's outbox has its own relay.
            store = await stores_from_settings(settings, pool, regional_pools,
                                               pool_max=max(2, settings.db_pool_max))
            router = store if isinstance(store, StoreRouter) else None
            async with SqsQueue(settings.queue_url or "", endpoint_url=settings.sqs_endpoint_url,
                                region=settings.aws_region) as queue:
                # The outbox rows of messages the API sent, marked by a batch of their own
                # rather than in each request (one store: see Control.mark_sent).
                marks = MicroBatcher[int](Store(pool).mark_sent, max_size=MARKS_PER_CALL,
                                          max_concurrent=2, linger_s=MARK_SENT_LINGER_S)
                control = Control(pool, queue, self.registry, actor="api",
                                  read_policy=policy_from(settings.read_policy), stores=router,
                                  mark_sent=marks.post)
                app = create_app(Services(control=control, queue=queue, fleet=fleet,
                                          auth=auth,
                                          max_body_bytes=settings.api_max_body_bytes,
                                          secure_cookie={"true": True, "false": False}.get(
                                              settings.console_secure_cookie)))
                self._server = _Server(uvicorn.Config(
                    app, host=self.options.host, port=self.options.port, log_config=None,
                    access_log=False, lifespan="off"), self._listening)
                tasks: dict[str, Callable[[], Awaitable[None]]] = {
                    "api": self._serve, "mark_sent": marks.run}
                if self.options.relay:
                    self._relay = Relay(store=Store(pool), queue=queue,
                                        after_s=settings.relay_after_s,
                                        interval_s=settings.relay_interval_s,
                                        batch=settings.relay_batch,
                                        stall_after_s=settings.relay_stall_after_s,
                                        claim_ttl_s=settings.relay_claim_ttl_s)
                    tasks["relay"] = self._relay.run
                    for region, regional in sorted((router.stores if router else {}).items()):
                        if region == DEFAULT_REGION:
                            continue
                        relay = Relay(store=regional, queue=queue,
                                      after_s=settings.relay_after_s,
                                      interval_s=settings.relay_interval_s,
                                      batch=settings.relay_batch,
                                      stall_after_s=settings.relay_stall_after_s,
                                      claim_ttl_s=settings.relay_claim_ttl_s)
                        self._regional_relays.append(relay)
                        tasks[f"relay-{region}"] = relay.run
                # The DLQ shares the work queue's client (one connection pool, one identity).
                dlq = queue.sibling(settings.dlq_url) if settings.dlq_url else None
                self._exporter = QueueDepthExporter(
                    queue=queue, views=control.views, dlq=dlq,
                    interval_s=self.options.exporter_interval_s)
                tasks["exporter"] = self._exporter.run
                self._presence_purger = PresencePurger(pool, settings.presence_retention_s)
                tasks["presence_purge"] = self._presence_purger.run
                if schedules:  # every replica runs one: a tick is claimed by exactly one
                    self._scheduler = Scheduler(
                        pool=pool, queue=queue, schedules=schedules,
                        catchup=settings.schedule_catchup,
                        catchup_max=settings.schedule_catchup_max,
                        interval_s=settings.schedule_interval_s)
                    tasks["scheduler"] = self._scheduler.run
                if self._stop.is_set():
                    return
                await self._supervise(tasks)
        finally:
            fleet.close()
            await regional_pools.aclose()
            await pool.close()

    def _listening(self) -> None:
        assert self._server is not None
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        log.info("orchestrator_listening", url=self.url, relay=self.options.relay)
        self.started.set()

    async def _serve(self) -> None:
        assert self._server is not None
        server = self._server
        await server.serve()
        if not self._stop.is_set():
            raise RuntimeError("the HTTP server stopped on its own (could it bind "
                               f"{self.options.host}:{self.options.port}?)")

    async def _supervise(self, factories: dict[str, Callable[[], Awaitable[None]]]) -> None:
        tasks = {asyncio.ensure_future(f()): name for name, f in factories.items()}
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        failure: BaseException | None = None
        for task in done:
            if not self._stop.is_set() or task.exception() is not None:
                failure = task.exception() or RuntimeError(f"{tasks[task]} stopped unexpectedly")
                log.error("side_task_died", task=tasks[task], error=repr(failure))
                break
        self.stop()
        # The batch of marks runs until cancelled, and only once the API has answered its
        # last request: its cancel flushes what those requests posted.
        last = [task for task, name in tasks.items() if name in STOPPED_LAST]
        await asyncio.gather(*(task for task in tasks if task not in last),
                             return_exceptions=True)
        for task in last:
            task.cancel()
        await asyncio.gather(*last, return_exceptions=True)
        if failure is not None:
            raise failure


@contextlib.asynccontextmanager
async def running_orchestrator(settings: Settings, registry: Registry,
                               options: OrchestratorOptions) -> AsyncIterator[Orchestrator]:
    """Run an orchestrator on this loop for the length of the block (the demo, tests)."""
    orchestrator = Orchestrator(settings, registry, options)
    task = asyncio.ensure_future(orchestrator.run())
    started = asyncio.ensure_future(orchestrator.started.wait())
    await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        started.cancel()
        task.result()
        raise RuntimeError("the orchestrator stopped before it started")
    try:
        yield orchestrator
    finally:
        orchestrator.stop()
        await task
