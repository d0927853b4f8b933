"""Prometheus metrics of the worker, in base units. Labels are low-cardinality: workflow and
phase names come from code, never from messages; workflow ids are never labels."""

from __future__ import annotations

import weakref
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)

PHASE_DURATION = Histogram(
    "phasegate_phase_duration_seconds", "Wall time of one phase handler run.",
    ["workflow", "phase", "outcome"], buckets=_PHASE_BUCKETS)
COMMIT_DURATION = Histogram(
    "phasegate_checkpoint_commit_duration_seconds",
    "Time of the one statement that commits checkpoint, run and outbox.",
    buckets=_LATENCY_BUCKETS)
GROUP_COMMIT_SIZE = Histogram(
    "phasegate_group_commit_size",
    "Calls sent in one statement by group commit / group load (1 = sent alone).",
    ["statement"], buckets=(1, 2, 4, 8, 16, 32, 64))
GROUP_COMMIT_FALLBACKS = Counter(
    "phasegate_group_commit_fallbacks_total",
    "Multi-row statements that failed as a whole and were retried one call each.",
    ["statement"])
STATEMENT_PREPARES = Counter(
    "phasegate_db_statement_prepares_total",
    "Statements named by their text (PHASEGATE_DATABASE_POOLER=pgbouncer): a name's first Parse "
    "on a client connection (first), a Parse sent to a server connection that lacked the name "
    "(missed), a Parse that found it there already (already_there), a call sent unnamed after "
    "too many misses (unnamed).",
    ["outcome"])
MESSAGES = Counter(
    "phasegate_messages_total", "Received messages by what became of them.", ["outcome"])
PHASES_IN_FLIGHT = Gauge("phasegate_phases_in_flight", "Phase handlers running now.")
# The phases each live transition is running (its ``running`` map): counted when scraped
# rather than moved up and down around every phase (two locked updates per hop).
_RUNNING: weakref.WeakSet[Any] = weakref.WeakSet()
PHASES_IN_FLIGHT.set_function(lambda: float(sum(len(t.running) for t in list(_RUNNING))))
MESSAGES_HELD = Gauge(
    "phasegate_messages_held", "Received messages this worker holds (running or waiting).")
OUTBOX_SEND_LAG = Histogram(
    "phasegate_outbox_send_lag_seconds",
    "From the commit to the successor message accepted by SQS.", buckets=_LATENCY_BUCKETS)
OUTBOX_LAG = Gauge(
    "phasegate_outbox_lag_seconds", "Age of the oldest unsent outbox row (relay view).")
OUTBOX_RELAYED = Counter(
    "phasegate_outbox_relayed_total", "Outbox rows sent by the relay, not by the worker.")
SQS_ERRORS = Counter("phasegate_sqs_errors_total", "SQS calls that failed.", ["action"])
DB_ERRORS = Counter("phasegate_db_unavailable_total",
                    "Messages handed back because PostgreSQL could not be reached.")
CONTINUED_HOPS = Counter(
    "phasegate_continued_hops_total",
    "Phases run locally right after the previous one committed (local continuation).")
OWN_SUCCESSORS = Counter(
    "phasegate_own_successors_total",
    "Messages this worker sent (a leased send) and received back, checked from memory "
    "without a load.")
CHAINS_RESCUED = Counter(
    "phasegate_chains_rescued_total",
    "Local chains whose worker died mid-chain, their next message rebuilt and sent.")
SENT_LEASES_LAPSED = Counter(
    "phasegate_sent_leases_lapsed_total",
    "Leased sends whose successor had not committed when the lease ran out, their message "
    "written as an outbox row and sent again (SQS drops it if the first send went out).")
HEARTBEATS = Counter("phasegate_heartbeat_extensions_total",
                     "Visibility extensions sent for in-flight messages.")
READY = Gauge("phasegate_ready", "1 once Postgres and SQS answered and the loop receives.")


_CHILDREN: dict[tuple[int, tuple[str, ...]], Any] = {}


def count_running(transition: Any) -> None:
    """Count ``transition.running`` (a map of the phases it runs) in ``PHASES_IN_FLIGHT`` for
    as long as the transition lives."""
    _RUNNING.add(transition)


def child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, remembered: ``labels()`` takes the metric's lock and builds
    its key on every call, and the transition asks for the same few children each time (labels
    are names from code and outcomes, never ids, so there are few). phasegate never removes a
    child, so a remembered one stays the registered one."""
    key = (id(metric), labels)
    found = _CHILDREN.get(key)
    if found is None:
        found = _CHILDREN[key] = metric.labels(*labels)
    return found
