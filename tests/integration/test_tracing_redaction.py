"""Tracing (OpenTelemetry SDK, in-memory exporter) and redaction: planted personal data in
state, inputs, exception messages and poison messages appears in no log line, span, metric,
quarantine row, run error or DLQ body that phasegate writes."""

from __future__ import annotations

import io
import json

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY as METRICS
from prometheus_client import generate_latest

from phasegate import NonRetryableError, Workflow, tracing
from phasegate.envelope import start_message
from phasegate.logs import configure_logging, reset_logging
from phasegate.orchestrator.starter import start_workflow
from phasegate.residency import RegionalStore
from phasegate.store import create_pool
from phasegate.workflow import Registry
from tests.helpers import (
    all_done,
    fetch,
    make_settings,
    queue_for,
    running_worker,
    send_raw,
    wait_for,
)

PII = "Jane Roe jane.roe@example.com +1-555-0199"
EMAIL = "jane.roe@example.com"

traced = Workflow("traced")


@traced.phase("first")
async def first(ctx, state):
    if ctx.attempt == 1:
        raise RuntimeError(f"could not reach CRM for {state['person']}")  # retried
    return {**state, "seen": state["person"]}


@traced.phase("second")
async def second(ctx, state):
    if state.get("fatal"):
        raise NonRetryableError(f"refusing {state['person']}")
    return {**state, "done": True}


# Three phases that always advance: with local continuation one received message runs all.
chained = Workflow("chained")


@chained.phase("a")
async def chained_a(ctx, state):
    return {**state, "a": True}


@chained.phase("b")
async def chained_b(ctx, state):
    return {**state, "b": True}


@chained.phase("c")
async def chained_c(ctx, state):
    return {**state, "c": True}


REGISTRY = Registry([traced, chained])


@pytest.fixture
def exporter(monkeypatch):
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(tracing, "_tracer", lambda: provider.get_tracer("phasegate"))
    yield memory
    provider.shutdown()


@pytest.fixture
def json_logs():
    """The production JSON log pipeline, into a buffer."""
    buffer = io.StringIO()
    configure_logging("debug", "json")
    config = structlog.get_config()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=buffer))
    yield buffer
    structlog.configure(**{**config, "logger_factory": structlog.PrintLoggerFactory()})
    structlog.reset_defaults()
    reset_logging()


@pytest.fixture
def settings(database_url, queue_pair, sqs_endpoint):
    return make_settings(database_url, queue_pair, sqs_endpoint, max_attempts=3)


async def start(settings, input, workflow: Workflow = traced) -> str:
    pool = await create_pool(settings.database_url, min_size=1, max_size=1)
    try:
        async with queue_for(settings) as queue:
            return (await start_workflow(RegionalStore(pool), queue, workflow=workflow,
                                         input=input)).workflow_id
    finally:
        await pool.close()


async def test_spans_per_phase_commit_and_send_share_one_trace_per_run(settings, exporter):
    # Every hop through SQS: the trace travels in the message (continued hops: below).
    settings = settings.model_copy(update={"continuation": False})
    wid = await start(settings, {"person": "p"})
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run done")
    spans = exporter.get_finished_spans()
    phases = [s for s in spans if s.name.startswith("phasegate.phase traced.")]
    commits = [s for s in spans if s.name == "phasegate.checkpoint.commit"]
    sends = [s for s in spans if s.name == "phasegate.sqs.send queue"]
    assert {s.attributes["phase.name"] for s in phases if "phase.name" in s.attributes} \
        == {"second"}
    assert len(phases) == 3  # start (failed once, then committed) + second
    assert [(c.attributes["workflow.id"], c.attributes["step.seq"],
             c.attributes["checkpoint.success"]) for c in commits] == [(wid, 0, True),
                                                                     (wid, 1, True)]
    by_id = {s.context.span_id: s for s in spans}
    for commit in commits:  # a child of its phase span
        assert by_id[commit.parent.span_id].name.startswith("phasegate.phase")
    assert sends and all(by_id[s.parent.span_id].name.startswith("phasegate.phase")
                         for s in sends)
    # The successor message carried the committing phase's traceparent: the next phase, on
    # any worker, continues that trace as its child.
    second_span = next(s for s in phases if s.attributes.get("phase.name") == "second")
    committing = by_id[commits[0].parent.span_id]
    assert second_span.context.trace_id == committing.context.trace_id
    assert second_span.parent.span_id == committing.context.span_id


async def test_a_continued_chain_has_one_span_per_phase_parented_like_hops_through_sqs(
        settings, exporter):
    """Local continuation runs b and c in the process that received a's message: each still
    gets its own phase span, a child of the previous phase's span (the parent the traceparent
    in its successor message names, as when it hops through SQS), with its own commit."""
    settings = settings.model_copy(update={"continuation": True})
    wid = await start(settings, {}, chained)
    hops_before = METRICS.get_sample_value("phasegate_continued_hops_total") or 0.0
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="run done")
    # b and c ran in the process that ran a, without a message of their own.
    assert METRICS.get_sample_value("phasegate_continued_hops_total") - hops_before == 2
    spans = exporter.get_finished_spans()
    phases = {s.attributes.get("phase.name", "start"): s for s in spans
              if s.name.startswith("phasegate.phase chained.")}
    assert sorted(phases) == ["b", "c", "start"]  # a's message is the start message
    assert len([s for s in spans if s.name.startswith("phasegate.phase chained.")]) == 3
    assert phases["b"].parent.span_id == phases["start"].context.span_id
    assert phases["c"].parent.span_id == phases["b"].context.span_id
    assert {s.context.trace_id for s in phases.values()} == {phases["start"].context.trace_id}
    assert [phases[p].attributes.get("phasegate.continued") for p in ("start", "b", "c")] \
        == [None, True, True]
    assert [phases[p].attributes["step.seq"] for p in ("start", "b", "c")] == [0, 1, 2]
    assert phases["b"].attributes["phasegate.outcome"] == "continued"
    assert phases["c"].attributes["phasegate.outcome"] == "completed"
    by_id = {s.context.span_id: s for s in spans}
    commits = [s for s in spans if s.name == "phasegate.checkpoint.commit"
               and s.attributes["workflow.id"] == wid]
    # One commit per phase, each the child of its own phase's span.
    assert sorted((by_id[c.parent.span_id].attributes.get("phase.name", "start"),
                   c.attributes["step.seq"]) for c in commits) \
        == [("b", 1), ("c", 2), ("start", 0)]

async def test_personal_data_never_leaves_through_phasegate(settings, exporter, json_logs):
    ok = await start(settings, {"person": PII})
    fatal = await start(settings, {"person": PII, "fatal": True})
    poison = {
        "not_json": f"name={PII}",
        "unknown_workflow": json.dumps({"v": 1, "kind": "start", "workflow_id": "pz-1",
                                        "workflow": "nope", "input": {"who": PII}}),
        "bad_field": json.dumps({"v": 1, "kind": "start", "workflow_id": "pz-2",
                                 "workflow": "traced", "email": EMAIL}),
        "bad_id": json.dumps({"v": 1, "kind": "start", "workflow_id": EMAIL,
                              "workflow": "traced"}),
        "unknown_region": start_message("pz-3", "traced", {"who": PII}).model_copy(
            update={"classification": "regulated", "region": "mars"}).to_json(),
    }
    for name, body in poison.items():
        await send_raw(settings, body, group=f"g-{name}")
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(settings.database_url, [ok]), what="run done")
        await wait_for(lambda: all_done(settings.database_url, [fatal], "failed"),
                       what="run failed")
        await wait_for(lambda: _quarantined(settings, len(poison)), what="quarantined")
    async with queue_for(settings, settings.dlq_url) as dlq:
        dlq_bodies: list[str] = []
        while batch := await dlq.receive(10, 1, 30):
            dlq_bodies += [m.body for m in batch]
    assert len(dlq_bodies) == len(poison)
    quarantine = await fetch(settings.database_url,
                             "SELECT reason, coalesce(workflow_id, '') AS w FROM quarantine")
    errors = await fetch(settings.database_url,
                         "SELECT coalesce(error, '') AS e FROM workflow_runs")
    spans = exporter.get_finished_spans()
    assert spans
    span_text = "\n".join(json.dumps({
        "name": s.name, "attributes": dict(s.attributes or {}),
        "events": [(e.name, dict(e.attributes or {})) for e in s.events],
        "status": s.status.description}, default=str) for s in spans)
    places = {
        "logs": json_logs.getvalue(),
        "spans": span_text,
        "metrics": generate_latest(METRICS).decode(),
        "quarantine": "\n".join(f"{r['reason']} {r['w']}" for r in quarantine),
        "run errors": "\n".join(r["e"] for r in errors),
        "dlq": "\n".join(dlq_bodies),
    }
    assert "phase_error" in places["logs"] and "withheld" in places["run errors"]
    leaks = {where: text.count(needle) for where, text in places.items()
             for needle in (PII, EMAIL, "Jane Roe") if needle in text}
    assert leaks == {}


async def _quarantined(settings, n: int) -> bool:
    rows = await fetch(settings.database_url, "SELECT count(*) AS n FROM quarantine")
    return int(rows[0]["n"]) >= n
