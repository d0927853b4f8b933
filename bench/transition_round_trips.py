"""The round-trip counting pass: each system's run once more, through a wire-protocol proxy
and after the timed rounds (so the proxy's hop is in no timed run), read as Postgres round
trips per transition, and by statement, named by the query each starts with
(``statement_names``).
"""

from __future__ import annotations

import re
from typing import Any

from bench.common import RoundTripProxy, with_port
from bench.transition_runs import SYSTEMS, Env, Workload
from phasegate.sql import queries

_WS = re.compile(r"\s+")


def statement_names() -> dict[str, str]:
    """The proxy labels statements by their first SQL characters; map those to query names."""
    return {_WS.sub(" ", sql)[:60]: name for name, sql in queries().items()}


async def count_round_trips(env: Env, workload: Workload) -> dict[str, Any]:
    names = statement_names()
    server = env.databases.server_dsn
    port = int(server.rsplit(":", 1)[1].split("/", 1)[0])
    found: dict[str, Any] = {}
    with RoundTripProxy(upstream_port=port) as proxy:
        for system in ("floor", "phasegate"):
            dsn = await env.databases.fresh()
            env.proxy = proxy
            try:
                proxied = with_port(dsn, proxy.port) + "?sslmode=disable"
                delta = (await SYSTEMS[system](proxied, workload, env))["round_trips"]
            finally:
                env.proxy = None
                await env.databases.drop(dsn)
            by_statement: dict[str, float] = {}
            for label, count in delta.items():
                if label.startswith(("exec:", "prepare:", "describe:", "simple:")) and count:
                    kind, _, text = label.partition(":")
                    name = names.get(text, text[:40])
                    by_statement[f"{kind}:{name}"] = count / workload.transitions
            found[system] = {
                "round_trips_per_transition": delta.get("round_trips", 0) / workload.transitions,
                "by_statement_per_transition": dict(sorted(by_statement.items(),
                                                           key=lambda kv: -kv[1])),
            }
            print(f"  {workload.key:10} {system:9} round trips/transition "
                  f"{found[system]['round_trips_per_transition']:.3f}  "
                  f"{found[system]['by_statement_per_transition']}", flush=True)
    return found
