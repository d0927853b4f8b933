"""The worker: receive, run phases concurrently, keep leases alive, settle, stop cleanly.

One ``Worker`` configured from settings. Stop is an event, not a cancel: on SIGTERM the worker
stops receiving, lets running phases finish within the shutdown grace, then hands every
message it still holds back to the queue with visibility 0 so another worker picks it up at
once. Side tasks (heartbeat, batchers, probes) are supervised: if one dies, the worker stops
loudly. Every message is settled (deleted or released) in exactly one place, ``_settle``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, suppress

import structlog

from phasegate import metrics, redact, tracing
from phasegate.backoff import Backoff
from phasegate.batcher import MARK_SENT_LINGER_S, MARKS_PER_CALL, MicroBatcher
from phasegate.faults import Faults
from phasegate.limits import SQS_MAX_RECEIVE_BATCH
from phasegate.queue import Outgoing, Queue, QueueError, Received
from phasegate.residency import StoreRouter
from phasegate.settings import Settings
from phasegate.store import Store
from phasegate.worker.deletion_cost import updater_from_settings
from phasegate.worker.emergency import EmergencyController
from phasegate.worker.heartbeat import extend_leases, extend_visibility
from phasegate.worker.outcomes import Action, Settlement
from phasegate.worker.presence import reporter_for
from phasegate.worker.probes import ProbeServer
from phasegate.worker.side_tasks import SideTasks
from phasegate.worker.startup import connect_dependencies
from phasegate.worker.transition import PhaseTransition
from phasegate.worker.transition_config import continuation_config, transition_config
from phasegate.worker.watchdog import Watchdog, WatchdogSettings, start_watchdog
from phasegate.workflow import Registry

log = structlog.get_logger("phasegate.worker")

# After the drain grace, a stopping worker spends at most DURABLE_DRAIN_S on commits/sends
# already past the phase, HAND_BACK_S on handing messages back and STOP_FLUSH_S on flushing
# its batchers and POOL_CLOSE_S (worker/startup.py) on closing its connections: 9.5 s, inside
# the chart's shutdownMarginSeconds (10 s), so the pod exits before its SIGKILL even when SQS or
# Postgres hangs (found by bench/chaos).
DURABLE_DRAIN_S = 4.0
HAND_BACK_S = 2.0
STOP_FLUSH_S = 2.0

# Retry window (full jitter, phasegate/backoff.py): the n-th retry waits random(0, min(cap,
# base * 2**n)) seconds; a failing receive backs off further than startup does.
RECEIVE_RETRY_BASE_S = 0.5
RECEIVE_RETRY_CAP_S = 10.0


class Worker:
    """Runs phases from one queue against one store. Build with ``Worker.from_settings``."""

    def __init__(self, *, settings: Settings, registry: Registry,
                 queue: Queue | None = None, dlq: Queue | None = None,
                 store: Store | None = None,
                 watchdog_settings: WatchdogSettings | None = None) -> None:
        self.settings = settings
        self.watchdog_settings = watchdog_settings or WatchdogSettings()
        self.registry = registry
        self.queue = queue
        self.dlq = dlq
        self.store = store
        self.faults = Faults(settings.faults, settings.fault_seed)
        self.transition: PhaseTransition | None = None
        self.probe_port: int | None = None
        self._stop = asyncio.Event()
        self._stop_waiter: asyncio.Task[bool] | None = None  # shared by every poll
        self._receiving = asyncio.Event()
        self._receiving.set()
        self._capacity_changed = asyncio.Event()
        self._concurrency_limit = settings.concurrency
        self._held: dict[str, Received] = {}
        self._started: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready = False
        self._signals = 0
        self.receive_calls = 0

    @classmethod
    def from_settings(cls, settings: Settings, registry: Registry | None = None) -> Worker:
        settings.require("database_url", "queue_url", "dlq_url")
        if registry is None:
            registry = Registry.from_modules(settings.module_list)
        return cls(settings=settings, registry=registry)

    # -- lifecycle ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop receiving and drain. Safe to call from a signal handler."""
        self._stop.set()
        self._receiving.set()
        self._capacity_changed.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second_signal_exiting_now", signal=sig.name)
            os._exit(1)
        log.info("stopping", signal=sig.name, grace_s=self.settings.shutdown_grace_s)
        self.stop()

    @property
    def ready(self) -> bool:
        return self._ready and not self._stop.is_set()

    @property
    def held(self) -> int:
        return len(self._held)

    # -- what the emergency flush (worker/emergency.py) steers -------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def concurrency_limit(self) -> int:
        return self._concurrency_limit

    def pause_receiving(self) -> None:
        if not self._stop.is_set():
            self._receiving.clear()

    def resume_receiving(self) -> None:
        self._receiving.set()
        self._capacity_changed.set()

    def set_concurrency(self, limit: int) -> None:
        self._concurrency_limit = max(1, limit)
        self._capacity_changed.set()

    async def shed_unstarted(self) -> int:
        """Hand back held messages whose phase has not started; returns how many."""
        unstarted = [h for h in self._held if h not in self._started]
        await self.hand_back(unstarted)
        return len(unstarted)

    async def run(self, *, burst: bool = False) -> None:
        """Run until ``stop()`` (or, with ``burst``, until the queue is drained)."""
        async with AsyncExitStack() as stack:
            probes = ProbeServer(self.settings.metrics_host, self.settings.metrics_port,
                                 ready=lambda: self.ready)
            if self.settings.metrics_port or self.settings.metrics_port == 0:
                self.probe_port = await probes.start()
                stack.push_async_callback(probes.stop)
            await self._connect_unless_stopped(stack)
            if self._stop.is_set():
                return
            assert self.store is not None and self.queue is not None and self.dlq is not None
            deleter = MicroBatcher[str](self.queue.delete)
            releaser = MicroBatcher[tuple[str, int]](self.queue.change_visibility)
            mark_sent = MicroBatcher[int](self.store.mark_sent, max_size=MARKS_PER_CALL,
                                          max_concurrent=2, linger_s=MARK_SENT_LINGER_S)
            sender = MicroBatcher[Outgoing](self.queue.send)
            self._delete, self._release = deleter.submit, releaser.submit
            tracing.reset()  # decide once, now, whether the application configured an SDK
            self.transition = PhaseTransition(
                store=self.store, queue=self.queue, dlq=self.dlq, registry=self.registry,
                config=transition_config(self.settings), faults=self.faults, sender=sender,
                # Outbox ids are per database: with several stores, mark each in its own.
                mark_sent=None if isinstance(self.store, StoreRouter) else mark_sent,
                continuation=continuation_config(self.settings, self.store),
                stopping=lambda: self._stop.is_set())
            side = SideTasks()
            for name, work in (("heartbeat", self._heartbeat()), ("deleter", deleter.run()),
                               ("releaser", releaser.run()), ("mark_sent", mark_sent.run()),
                               ("sender", sender.run())):
                side.start(name, work)
            # Best effort by design: the updater swallows its own failures, so it can never
            # be the side task that stops the worker.
            cost = updater_from_settings(self.settings, self._uncommitted_seconds)
            if cost is not None:
                side.start("deletion_cost", cost.run())
            emergency = EmergencyController(self, self.watchdog_settings)
            watchdog: Watchdog | None = start_watchdog(
                self.watchdog_settings, asyncio.get_running_loop(), emergency.submit)
            if watchdog is not None:
                stack.callback(watchdog.stop)
                side.start("emergency", emergency.run())
            # Logs and retries its own failures: a database outage never ends it.
            presence = reporter_for(self, emergency if watchdog is not None else None)
            if presence is not None:
                side.start("presence", presence.run())
            self._ready = True
            metrics.READY.set(1)
            log.info("worker_ready", worker_id=self.settings.worker_id,
                     presence_id=presence.worker_id if presence else None,
                     workflows=self.registry.names(), concurrency=self.settings.concurrency)
            try:
                # A dead side task stops the worker loudly (worker/side_tasks.py).
                await side.supervise(self._receive_loop(burst), stop=self.stop,
                                     drain=self._drain)
                await self._drain()
            finally:
                self._ready = False
                metrics.READY.set(0)
                await side.stop(STOP_FLUSH_S)
            log.info("worker_stopped")

    def _uncommitted_seconds(self) -> list[float]:
        """Seconds each running phase has worked since its message was taken (uncommitted)."""
        if self.transition is None:
            return []
        now = time.monotonic()
        return [now - phase.started for phase in self.transition.running.values()]

    # -- startup ------------------------------------------------------------------------------

    async def _connect_unless_stopped(self, stack: AsyncExitStack) -> None:
        """``_connect``, abandoned the moment stop() is called: one probe can hang for many
        seconds in an outage (botocore's retries, a connect timeout), and a SIGTERM must not
        wait for it (found by bench/chaos: a worker still starting during an SQS outage
        outlived the grace and was SIGKILLed)."""
        connect = asyncio.ensure_future(connect_dependencies(
            self.settings, stack, self._stop, (self.store, self.queue, self.dlq)))
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({connect, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if connect.done():
            found = connect.result()
            if found is not None:
                self.store, self.queue, self.dlq = found.store, found.queue, found.dlq
            return
        connect.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await connect

    # -- receiving ----------------------------------------------------------------------------

    async def _receive_loop(self, burst: bool) -> None:
        try:
            await self._poll_until_stopped(burst)
        finally:
            if self._stop_waiter is not None:
                self._stop_waiter.cancel()
                self._stop_waiter = None

    async def _poll_until_stopped(self, burst: bool) -> None:
        assert self.queue is not None
        # Full jitter (phasegate/backoff.py): a fleet that lost SQS together does not come back
        # in lockstep.
        errors = Backoff(base=RECEIVE_RETRY_BASE_S, cap=RECEIVE_RETRY_CAP_S)
        while not self._stop.is_set():
            await self._receiving.wait()
            free = await self._wait_for_capacity()
            if self._stop.is_set():
                break
            try:
                messages = await self._receive(min(SQS_MAX_RECEIVE_BATCH, free))
            except Exception as exc:
                metrics.SQS_ERRORS.labels("receive").inc()
                error_delay = errors.next()
                log.warning("receive_failed", error=f"{type(exc).__name__}: {exc}"[:300],
                            retry_in_s=round(error_delay, 3))
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), error_delay)
                continue
            errors.reset()
            if messages is None:
                break
            if messages:
                messages = await self._admit(messages)
            if messages:
                self._dispatch(messages)
            elif burst and not self._held and await self._queue_empty():
                break

    async def _receive(self, max_messages: int) -> list[Received] | None:
        """One long poll that gives way to stop(); None if stopped while waiting."""
        assert self.queue is not None
        self.receive_calls += 1
        receive = asyncio.ensure_future(self.queue.receive(
            max_messages, self.settings.wait_time_s, self.settings.visibility_timeout_s))
        # One waiter for every poll until stop: a task of its own per poll was one of a
        # transition's eight.
        if self._stop_waiter is None:
            self._stop_waiter = asyncio.ensure_future(self._stop.wait())
        done, _ = await asyncio.wait({receive, self._stop_waiter},
                                     return_when=asyncio.FIRST_COMPLETED)
        if receive in done:
            return receive.result()
        # Messages this poll would have returned stay invisible only until their timeout.
        receive.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await receive
        return None

    async def _admit(self, messages: list[Received]) -> list[Received]:
        """A long poll may return after an emergency flush paused receiving or lowered the
        concurrency: hand back at once what no longer fits."""
        free = (self._concurrency_limit - len(self._held)) if self._receiving.is_set() else 0
        if len(messages) <= free:
            return messages
        keep, excess = messages[:max(0, free)], messages[max(0, free):]
        await self.hand_back([m.receipt_handle for m in excess])
        return keep

    async def _queue_empty(self) -> bool:
        assert self.queue is not None
        depth = await self.queue.depth()
        return depth.visible == 0 and depth.inflight == 0 and depth.delayed == 0

    async def _wait_for_capacity(self) -> int:
        while not self._stop.is_set():
            free = self._concurrency_limit - len(self._held)
            if free > 0 and self._receiving.is_set():
                return free
            self._capacity_changed.clear()
            await self._capacity_changed.wait()
        return 0

    def _dispatch(self, messages: Sequence[Received]) -> None:
        """Messages of one group run in order in one task; groups run concurrently."""
        groups: dict[str, list[Received]] = {}
        for message in messages:
            self._held[message.receipt_handle] = message
            groups.setdefault(message.group_id or message.message_id, []).append(message)
        metrics.MESSAGES_HELD.set(len(self._held))
        for group in groups.values():
            task = asyncio.create_task(self._process_group(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _process_group(self, messages: list[Received]) -> None:
        assert self.transition is not None
        for message in messages:
            if self._stop.is_set() or message.receipt_handle not in self._held:
                return  # not started: the drain hands it back
            self._started.add(message.receipt_handle)
            try:
                settlement = await self.transition.handle(message)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # SystemExit included: user code never ends a worker
                settlement = await self._crashed(message, exc)
            await self._settle(message, settlement)

    async def _crashed(self, message: Received, exc: BaseException) -> Settlement:
        """Counted and bounded by the transition; if even that fails (the database is
        down), the lease expires and the message comes back."""
        assert self.transition is not None
        try:
            return await self.transition.crashed(message, exc)
        except asyncio.CancelledError:
            raise
        except BaseException as again:
            log.error("crash_not_counted", **redact.describe(again))
            return Settlement(Action.RELEASE, "crashed", self.settings.visibility_timeout_s)

    # -- the one place messages are settled -----------------------------------------------

    async def _settle(self, message: Received, settlement: Settlement) -> None:
        try:
            if settlement.action is Action.DELETE:
                # The successor's send is already under way in a task of its own, so waiting
                # for the delete first and then for the send waits for the longer of the two,
                # as running both at once did, without a task and a gather for the delete.
                await self._delete(message.receipt_handle)
                sending = settlement.sending
                if sending is not None and not sending.done():
                    # Shielded: the send is durable (the transition's), whatever happens here.
                    await asyncio.shield(sending)
                elif sending is not None:
                    sending.result()  # its error, as awaiting it would raise
            else:
                await self._release((message.receipt_handle, settlement.visibility_s))
        except Exception as exc:
            action = "delete" if settlement.action is Action.DELETE else "release"
            metrics.SQS_ERRORS.labels(action).inc()
            log.warning("settle_failed", action=action, error=f"{type(exc).__name__}"[:200])
        finally:
            metrics.child(metrics.MESSAGES, settlement.outcome).inc()
            self._forget(message.receipt_handle)

    def _forget(self, receipt_handle: str) -> None:
        self._held.pop(receipt_handle, None)
        self._started.discard(receipt_handle)
        metrics.MESSAGES_HELD.set(len(self._held))
        self._capacity_changed.set()

    _delete: Callable[[str], Awaitable[None]]
    _release: Callable[[tuple[str, int]], Awaitable[None]]

    async def hand_back(self, receipt_handles: Sequence[str]) -> None:
        """Visibility 0: another worker may take these at once. Work here is retryable."""
        if not receipt_handles or self.queue is None:
            return
        # Forget first: a group task checks _held before it starts a message, so nothing
        # being handed back can start while the call is in flight.
        for handle in receipt_handles:
            self._forget(handle)
        try:
            # Bounded: a message not handed back comes back at its visibility timeout anyway.
            await asyncio.wait_for(self.queue.change_visibility(
                [(h, 0) for h in receipt_handles]), HAND_BACK_S)
            log.info("handed_back", messages=len(receipt_handles))
        except QueueError as exc:
            log.warning("hand_back_partial", failed=len(exc.failed))
        except Exception as exc:
            metrics.SQS_ERRORS.labels("hand_back").inc()
            log.warning("hand_back_failed", error=type(exc).__name__)

    # -- stopping -----------------------------------------------------------------------------

    async def _drain(self) -> None:
        """Let running phases finish within the grace; hand back whatever is left."""
        unstarted = [h for h in self._held if h not in self._started]
        await self.hand_back(unstarted)
        running = [t for t in self._tasks if not t.done()]
        committing: list[asyncio.Task[None]] = []
        if running:
            log.info("draining", phases=len(running), grace_s=self.settings.shutdown_grace_s)
            _, late = await asyncio.wait(running, timeout=self.settings.shutdown_grace_s)
            # A phase past the grace is cancelled; a transition whose commit is in flight is
            # not: its commit, hand-off and delete finish within the durable share below.
            in_commit = self.transition.committing if self.transition is not None else set()
            committing = [task for task in late if task in in_commit]
            cancelled = [task for task in late if task not in in_commit]
            for task in cancelled:
                task.cancel()
            await asyncio.gather(*cancelled, return_exceptions=True)
            if late:
                log.warning("grace_expired_handing_back", phases=len(cancelled),
                            committing=len(committing))
        durable = [*committing, *(self.transition.durable if self.transition else ())]
        if durable:
            # Commits and sends still in flight get a bounded share of the margin the chart
            # leaves beyond the grace, then are abandoned: a commit is atomic either way and
            # an unsent successor is the relay's (found by bench/chaos: emits retrying through
            # an SQS outage kept a draining worker alive past terminationGracePeriodSeconds).
            _, late_commits = await asyncio.wait(durable, timeout=DURABLE_DRAIN_S)
            for commit in late_commits:
                commit.cancel()
            await asyncio.gather(*late_commits, return_exceptions=True)
            if late_commits:
                log.warning("durable_abandoned_at_stop", commits=len(late_commits))
        await self.hand_back(list(self._held))

    # -- heartbeat (worker/heartbeat.py) ------------------------------------------------------

    async def _heartbeat(self) -> None:
        """Extend the lease of every held message, so the visibility timeout can stay short
        and a dead worker's message comes back in seconds."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)  # a period, not a synchronisation
            await self._beat()

    async def _beat(self) -> None:
        assert self.queue is not None
        await extend_leases(self.transition.leases if self.transition else None,
                            self.settings.heartbeat_s)
        await extend_visibility(self.queue, self._held, self.settings.visibility_timeout_s)
