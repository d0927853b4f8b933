"""The capacity model: what a fleet of N worker pods asks of PostgreSQL, the pooler and SQS.

    python -m bench.capacity            # the plan from 1 to 1,000 pods at the documented settings

Every load is a product of a setting and a measured per-transition cost, so the plan says
which budget binds first. tests/deploy/test_capacity_simulation.py drives a queue-depth trace
through the rendered chart's HPA and this model and asserts no budget is exceeded; the plan's
table is in docs/reference/capacity.md.

Per transition (one phase: run, commit, and for one phase in a chain the successor's send,
its receive and its delete):
- PostgreSQL: the costs ``python -m bench.capacity_costs`` measures through PgBouncer in the
  plan's own shape (``MEASURED``; ``MEASURED_PLAIN`` without local continuation): the seconds
  a server connection spends in a transaction, commits and WAL bytes, each worker's periodic
  writes (presence, chain leases) included in the plan's proportion;
- SQS: with local continuation (the default) one phase in ``phases_per_message`` goes through
  SQS, so one ReceiveMessage, SendMessage and DeleteMessage per that many transitions at most
  (batching only lowers them); without it, or for runs that use reviews, tiers or branches
  (they always go through SQS), one each per transition. ChangeMessageVisibility once per
  heartbeat per pod (one batch call);
- the orchestrator: GetQueueAttributes every exporter interval per replica, the relay's
  outbox query every relay interval per replica; KEDA polls the queue on its own interval.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, replace

from phasegate.limits import (
    SQS_FIFO_CALLS_PER_S,
    SQS_FIFO_HT_CALLS_PER_S_MAX,
    SQS_FIFO_HT_CALLS_PER_S_PER_GROUP,
    SQS_MAX_BATCH_ENTRIES,
)


@dataclass(frozen=True)
class Costs:
    """Per-transition costs of a saturated fleet with a backlog (``python -m
    bench.capacity_costs --continuation on|off``: four workers through PgBouncer 1.18 in
    transaction mode, the plan's times scaled by 0.1, the 2-core build machine; the largest of
    three rounds, results
    ``bench/results/capacity-costs-20261207T234456-s31-on.json``, ``...T234721-s31-off.json``)."""

    # Seconds a server connection spends in a transaction per transition (PgBouncer's
    # total_xact_time): with Little's law, the server connections a fleet keeps busy.
    db_server_s: float
    # Commit records per transition (each a WAL flush), the workers' periodic writes included.
    commits: float
    # WAL bytes per transition (1 KB of state), the periodic writes included.
    wal_bytes: float


# With local continuation (the default): a continued phase is one commit.
MEASURED = Costs(db_server_s=0.00343, commits=1.16, wal_bytes=1_992)
# Without it (PHASEGATE_CONTINUATION=false): every phase is a check, a commit and its
# successor's send.
MEASURED_PLAIN = Costs(db_server_s=0.00378, commits=1.049, wal_bytes=1_963)


@dataclass(frozen=True)
class Settings:
    """The documented settings the plan and the simulation use (chart defaults unless noted)."""

    concurrency: int = 4  # worker.concurrency
    pool_max: int = 4  # database.poolMax
    phase_s: float = 5.0  # a typical phase (the workload's, not a setting)
    heartbeat_s: float = 10.0  # worker.heartbeatSeconds
    wait_time_s: float = 20.0  # PHASEGATE_WAIT_TIME_S (long poll)
    orchestrator_replicas: int = 2
    exporter_interval_s: float = 5.0
    relay_interval_s: float = 1.0
    relay_batch: int = 100
    keda_polling_s: float = 15.0  # autoscaling.keda.pollingInterval
    high_throughput_fifo: bool = True
    continuation: bool = True  # PHASEGATE_CONTINUATION
    continuation_max_hops: int = 16  # PHASEGATE_CONTINUATION_MAX_HOPS
    continuation_max_s: float = 30.0  # PHASEGATE_CONTINUATION_MAX_S


def phases_per_message(s: Settings) -> int:
    """Phases one received message runs: itself, then continued hops until the chain's bound
    (worker/continuation.py: a phase committed at k x phase_s continues while k <= max hops
    and k x phase_s < max seconds)."""
    if not s.continuation:
        return 1
    return min(s.continuation_max_hops + 1, max(1, math.ceil(s.continuation_max_s / s.phase_s)))


def costs_for(s: Settings) -> Costs:
    return MEASURED if s.continuation else MEASURED_PLAIN


@dataclass(frozen=True)
class Budgets:
    """What the platform allows. Defaults: an RDS db.r6g.large behind RDS Proxy/PgBouncer."""

    # Server connections the pooler may open (PgBouncer default_pool_size / RDS Proxy
    # MaxConnectionsPercent of max_connections), leaving room for migrations and people.
    server_connections: int = 40
    # Client connections the pooler accepts (PgBouncer max_client_conn; RDS Proxy allows far
    # more).
    client_connections: int = 5_000
    commits_per_s: float = 5_000.0
    wal_bytes_per_s: float = 64 * 2**20
    sqs_calls_per_s_per_action: float = float(SQS_FIFO_HT_CALLS_PER_S_MAX)
    sqs_calls_per_s_per_group: float = float(SQS_FIFO_HT_CALLS_PER_S_PER_GROUP)


@dataclass(frozen=True)
class Load:
    pods: int
    transitions_per_s: float
    client_connections: int
    server_connections: float
    commits_per_s: float
    wal_bytes_per_s: float
    receive_calls_per_s: float
    send_calls_per_s: float
    delete_calls_per_s: float
    visibility_calls_per_s: float
    attribute_calls_per_s: float
    calls_per_s_per_group: float
    relay_queries_per_s: float
    relay_capacity_per_s: float


def load(pods: int, transitions_per_s: float, settings: Settings = Settings(),
         costs: Costs | None = None) -> Load:
    """The loads of ``pods`` workers completing ``transitions_per_s`` transitions."""
    s = settings
    c = costs or costs_for(s)
    t = transitions_per_s
    per_message = phases_per_message(s)
    messages = t / per_message  # phases that go through SQS
    idle_polls = pods / s.wait_time_s  # an idle worker's long poll returns empty every wait
    orchestrator_pool = max(2, s.pool_max)
    # One message of a run is in flight at a time, for its chain's phases: receive,
    # heartbeats, delete, send.
    held_s = per_message * s.phase_s
    return Load(
        pods=pods, transitions_per_s=t,
        client_connections=pods * s.pool_max + s.orchestrator_replicas * orchestrator_pool,
        server_connections=t * c.db_server_s,  # Little's law on the server side
        commits_per_s=t * c.commits, wal_bytes_per_s=t * c.wal_bytes,
        receive_calls_per_s=messages + idle_polls, send_calls_per_s=messages,
        delete_calls_per_s=messages,
        visibility_calls_per_s=pods * math.ceil(s.concurrency / SQS_MAX_BATCH_ENTRIES)
        / s.heartbeat_s,
        attribute_calls_per_s=s.orchestrator_replicas / s.exporter_interval_s
        + 1 / s.keda_polling_s,
        calls_per_s_per_group=(3 + held_s / s.heartbeat_s) / held_s,
        relay_queries_per_s=s.orchestrator_replicas / s.relay_interval_s,
        relay_capacity_per_s=s.orchestrator_replicas * s.relay_batch / s.relay_interval_s)


def saturated(pods: int, settings: Settings = Settings(), costs: Costs | None = None) -> Load:
    """Every slot of every pod busy: ``pods x concurrency / phase_s`` transitions per second."""
    return load(pods, pods * settings.concurrency / settings.phase_s, settings, costs)


def budgets_for(settings: Settings) -> Budgets:
    if settings.high_throughput_fifo:
        return Budgets()
    return Budgets(sqs_calls_per_s_per_action=float(SQS_FIFO_CALLS_PER_S),
                   sqs_calls_per_s_per_group=float(SQS_FIFO_CALLS_PER_S))


def exceeded(x: Load, budgets: Budgets) -> list[str]:
    """Every budget ``x`` exceeds, named; empty when the load fits."""
    checks = [
        ("client connections", x.client_connections, budgets.client_connections),
        ("server connections", x.server_connections, budgets.server_connections),
        ("commits/s", x.commits_per_s, budgets.commits_per_s),
        ("WAL bytes/s", x.wal_bytes_per_s, budgets.wal_bytes_per_s),
        ("SQS ReceiveMessage/s", x.receive_calls_per_s, budgets.sqs_calls_per_s_per_action),
        ("SQS SendMessage/s", x.send_calls_per_s, budgets.sqs_calls_per_s_per_action),
        ("SQS DeleteMessage/s", x.delete_calls_per_s, budgets.sqs_calls_per_s_per_action),
        ("SQS ChangeMessageVisibility/s", x.visibility_calls_per_s,
         budgets.sqs_calls_per_s_per_action),
        ("SQS GetQueueAttributes/s", x.attribute_calls_per_s,
         budgets.sqs_calls_per_s_per_action),
        ("SQS calls/s per message group", x.calls_per_s_per_group,
         budgets.sqs_calls_per_s_per_group),
    ]
    return [f"{name} {value:,.1f} > {limit:,.0f}" for name, value, limit in checks
            if value > limit]


PLAN_PODS = (1, 10, 50, 100, 250, 500, 1000)


def plan_table(settings: Settings = Settings(), costs: Costs | None = None) -> str:
    """The Markdown table of docs/reference/capacity.md."""
    budgets = budgets_for(settings)
    lines = ["| pods | transitions/s | client conns | server conns | commits/s | WAL MiB/s "
             "| Receive/s | Send/s | Delete/s | ChangeVisibility/s | within budgets |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for pods in PLAN_PODS:
        x = saturated(pods, settings, costs)
        over = exceeded(x, budgets)
        lines.append(
            f"| {pods:,} | {x.transitions_per_s:,.0f} | {x.client_connections:,} | "
            f"{x.server_connections:,.1f} | {x.commits_per_s:,.0f} | "
            f"{x.wal_bytes_per_s / 2**20:,.1f} | {x.receive_calls_per_s:,.0f} | "
            f"{x.send_calls_per_s:,.0f} | {x.delete_calls_per_s:,.0f} | "
            f"{x.visibility_calls_per_s:,.0f} | {'yes' if not over else '; '.join(over)} |")
    return "\n".join(lines)


def main() -> int:
    settings = Settings()
    plain = replace(settings, continuation=False)
    print(f"settings: {asdict(settings)}")
    print(f"phases per SQS message: {phases_per_message(settings)}")
    print(f"measured costs: {asdict(MEASURED)}; without continuation: {asdict(MEASURED_PLAIN)}")
    print(f"budgets: {asdict(budgets_for(settings))}\n")
    print(plan_table(settings))
    print("\nwithout local continuation (every phase through SQS):\n")
    print(plan_table(plain))
    print("\nwithout continuation, on a FIFO queue without high-throughput mode:\n")
    print(plan_table(replace(plain, high_throughput_fifo=False)))
    print("\nwith continuation, on a FIFO queue without high-throughput mode:\n")
    print(plan_table(replace(settings, high_throughput_fifo=False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
