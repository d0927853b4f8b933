"""The quickstart's workflow (docs/examples/orders.py, shown in docs/quickstart.md) runs as the
page says: a real worker, real PostgreSQL, a real SQS server over HTTP."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from phasegate.steps import idempotency_key
from phasegate.workflow import Registry
from tests.helpers import all_done, fetch, running_worker, wait_for
from tests.room_helpers import start

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_quickstart_order_runs_as_documented(settings):
    orders = load_example("orders").orders
    wid = await start(settings, orders, {"order_id": "o-1",
                                         "items": [{"sku": "tea", "cents": 450, "qty": 2}]})
    async with running_worker(settings, Registry([orders])):
        await wait_for(lambda: all_done(settings.database_url, [wid]), what="completed")
    rows = await fetch(settings.database_url, "SELECT seq, phase, state::text AS state "
                       "FROM checkpoints WHERE workflow_id = $1 ORDER BY seq", wid)
    assert [(r["seq"], r["phase"]) for r in rows] == [(0, "price"), (1, "charge"),
                                                      (2, "confirm")]
    charge_id = f"ch_{idempotency_key(wid, 'main', 1, 1)[:12]}"
    assert json.loads(rows[-1]["state"]) == {"order_id": "o-1", "charge_id": charge_id,
                                             "status": "paid"}
    steps = await fetch(settings.database_url, "SELECT step_name, category, status "
                        "FROM step_records WHERE workflow_id = $1", wid)
    assert [tuple(r) for r in steps] == [("charge_card", "write", "completed")]


async def test_an_order_without_items_fails_at_once(settings):
    orders = load_example("orders").orders
    wid = await start(settings, orders, {"order_id": "o-2", "items": []})
    async with running_worker(settings, Registry([orders])):
        await wait_for(lambda: all_done(settings.database_url, [wid], "failed"), what="failed")
    (run,) = await fetch(settings.database_url, "SELECT status, attempts, error "
                         "FROM workflow_runs WHERE workflow_id = $1", wid)
    assert run["status"] == "failed"
    assert run["error"].startswith("NonRetryableError")
