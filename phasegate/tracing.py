"""OpenTelemetry tracing: a span per phase, a child span per checkpoint commit, a span per SQS
send, and the envelope's ``traceparent`` carrying a run's trace from phase to phase (a phase
continued in process gets its span from the same ``traceparent``, as if it came through SQS).

Optional: ``pip install phasegate[otel]`` brings the OpenTelemetry API; without it, or without
an SDK configured by the application (``TracerProvider`` + exporter), every call here is a
no-op that allocates nothing. Whether an SDK is configured is decided once, at the first span
after ``reset()``; every worker calls ``reset()`` as it starts, so configure the SDK before
starting the worker. Span attributes are ids, numbers and names from code -- never workflow
state, input, outputs or exception messages (``record_exception`` is off; a failed span carries the
exception's type only).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from phasegate.envelope import Envelope

try:  # the optional dependency
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised only without the extra installed
    trace = None  # type: ignore[assignment]

TRACER_NAME = "phasegate"


class SpanHandle:
    """What a hook sets on its span after the fact (a no-op without a span)."""

    def __init__(self, span: Any = None) -> None:
        self.span = span

    def set(self, key: str, value: str | int | float | bool) -> None:
        if self.span is not None:
            self.span.set_attribute(key, value)

    def failed(self, error_type: str) -> None:
        if self.span is not None:
            self.span.set_status(Status(StatusCode.ERROR, error_type))


class _Undecided:
    pass


_UNDECIDED = _Undecided()
_decided: Any = _UNDECIDED


def reset() -> None:
    """Decide again at the next span whether an SDK is configured (the worker's start)."""
    global _decided
    _decided = _UNDECIDED


def _tracer() -> Any:
    """phasegate's tracer, or None without an SDK. Decided once: the lookup reads
    ``os.environ`` and was 3 lookups per transition, ~5 % of the worker's CPU (issue 18)."""
    global _decided
    if _decided is _UNDECIDED:
        _decided = _lookup()
    return _decided


def _lookup() -> Any:
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    # No SDK configured (the default proxy, or an explicit no-op): no span machinery at all.
    # Going through the proxy's no-op spans cost ~13 % of the worker's CPU per transition.
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer(TRACER_NAME)


class _NoSpan:
    """The context manager every span helper returns without a tracer: one shared object,
    no generator, no attribute dict."""

    handle = SpanHandle()

    def __enter__(self) -> SpanHandle:
        return self.handle

    def __exit__(self, *exc: object) -> None:
        return None


_NO_SPAN = _NoSpan()


def _parent(traceparent: str | None) -> Any:
    if trace is None or not traceparent:
        return None
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


@contextmanager
def _span(name: str, *, kind: Any = None, context: Any = None,
          attributes: dict[str, Any] | None = None) -> Iterator[SpanHandle]:
    tracer = _tracer()
    if tracer is None:
        yield SpanHandle()
        return
    with tracer.start_as_current_span(
            name, context=context, kind=kind or SpanKind.INTERNAL, attributes=attributes,
            record_exception=False, set_status_on_exception=False) as span:
        handle = SpanHandle(span)
        try:
            yield handle
        except BaseException as exc:
            handle.failed(type(exc).__name__)
            raise


def _run_attributes(envelope: Envelope) -> dict[str, Any]:
    attributes: dict[str, Any] = {"workflow.id": envelope.workflow_id,
                                  "workflow.name": envelope.workflow,
                                  "step.seq": envelope.seq, "workflow.branch": envelope.branch,
                                  "messaging.system": "aws_sqs"}
    if envelope.phase:
        attributes["phase.name"] = envelope.phase
    if envelope.region:
        attributes["phasegate.region"] = envelope.region
    return attributes


def phase_span(envelope: Envelope) -> AbstractContextManager[SpanHandle]:
    """The span of one message's phase, a child of the trace its envelope carries."""
    return _NO_SPAN if _tracer() is None else _phase_span(envelope)


@contextmanager
def _phase_span(envelope: Envelope) -> Iterator[SpanHandle]:
    name = f"phasegate.phase {envelope.workflow}.{envelope.phase or 'start'}"
    with _span(name, kind=SpanKind.CONSUMER if trace is not None else None,
               context=_parent(envelope.traceparent),
               attributes=_run_attributes(envelope)) as handle:
        yield handle


def hop_span(envelope: Envelope, hops: int) -> AbstractContextManager[SpanHandle]:
    """The span of a phase continued in process (``hops`` > 0: worker/continuation.py), named
    and parented as if it had come through SQS: a child of the trace its successor message
    carries (the previous phase's span), with ``phasegate.continued``. The first hop of a
    chain is the received message's ``phase_span``: nothing here."""
    return _NO_SPAN if hops == 0 or _tracer() is None else _hop_span(envelope)


@contextmanager
def _hop_span(envelope: Envelope) -> Iterator[SpanHandle]:
    attributes = _run_attributes(envelope)
    del attributes["messaging.system"]  # no message was received for it
    attributes["phasegate.continued"] = True
    with _span(f"phasegate.phase {envelope.workflow}.{envelope.phase or 'start'}",
               context=_parent(envelope.traceparent), attributes=attributes) as handle:
        yield handle


def commit_span(envelope: Envelope) -> AbstractContextManager[SpanHandle]:
    """The checkpoint commit; ``handle.set("checkpoint.success", ...)`` after it."""
    return _NO_SPAN if _tracer() is None else _commit_span(envelope)


@contextmanager
def _commit_span(envelope: Envelope) -> Iterator[SpanHandle]:
    with _span("phasegate.checkpoint.commit", attributes={
            "workflow.id": envelope.workflow_id, "step.seq": envelope.seq,
            "workflow.branch": envelope.branch, "db.system": "postgresql"}) as handle:
        yield handle


def send_span(destination: str, messages: int = 1) -> AbstractContextManager[SpanHandle]:
    """An SQS send: ``destination`` is ``queue``, ``dlq`` or ``relay``, never a URL."""
    return _NO_SPAN if _tracer() is None else _send_span(destination, messages)


@contextmanager
def _send_span(destination: str, messages: int) -> Iterator[SpanHandle]:
    with _span(f"phasegate.sqs.send {destination}",
               kind=SpanKind.PRODUCER if trace is not None else None,
               attributes={"messaging.system": "aws_sqs", "messaging.operation": "publish",
                           "messaging.destination.name": destination,
                           "messaging.batch.message_count": messages}) as handle:
        yield handle


def current_traceparent() -> str | None:
    """The W3C traceparent of the active span (None without one)."""
    if trace is None:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def propagate(envelope: Envelope, successor: Envelope | None) -> Envelope | None:
    """The successor message carries the current phase's trace context (so the next phase,
    on any worker, joins the same trace); without a span, whatever the envelope carried."""
    if successor is None:
        return None
    # Without a tracer there is no current span: skip the propagator's inject.
    current = current_traceparent() if _tracer() is not None else None
    traceparent = current or envelope.traceparent
    if traceparent == successor.traceparent:
        return successor
    return successor.model_copy(update={"traceparent": traceparent})
