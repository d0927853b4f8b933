"""bench/per_transition.py counts what it says, inside its block only, and puts every
wrapped function back."""

from __future__ import annotations

import asyncio
import hashlib
import json

import structlog

from bench.per_transition import FIGURES, WorkCounts


async def _work() -> None:
    async def child() -> None:
        json.loads(json.dumps({"a": 1}))

    await asyncio.create_task(child())
    hashlib.sha256(b"x").hexdigest()
    structlog.get_logger("test").info("counted")


async def test_counts_tasks_callbacks_json_digests_and_log_lines_then_restores() -> None:
    loop = asyncio.get_running_loop()
    dumps, loads, sha256 = json.dumps, json.loads, hashlib.sha256
    processors = list(structlog.get_config()["processors"])
    with WorkCounts(loop) as counts:
        await _work()
        await _work()
    await _work()  # after the block: not counted
    per = counts.per(2)
    assert set(per) == set(FIGURES)
    assert per["tasks"] == 1 and per["json_encodings"] == 1 and per["json_decodings"] == 1
    assert per["sha256"] == 1 and per["log_lines"] == 1
    assert per["call_soon"] >= 1 and per["futures"] == 0 and per["pool_acquires"] == 0
    assert (json.dumps, json.loads, hashlib.sha256) == (dumps, loads, sha256)
    assert structlog.get_config()["processors"] == processors
    assert "call_soon" not in vars(loop) and loop.get_task_factory() is None


async def test_counts_records_and_frozen_dataclasses_built_then_restores() -> None:
    from phasegate.queue import Received
    from phasegate.worker.continuation import ContinuationConfig

    received_init = vars(Received)["__init__"]
    frozen = ContinuationConfig.__init__
    with WorkCounts(asyncio.get_running_loop()) as counts:
        Received("m", "r", "{}", "g", 1)
        Received("m", "r", "{}", "g", 2)
        frozen_args = {name: 0 for name in ContinuationConfig.__dataclass_fields__}
        ContinuationConfig(**frozen_args)
    Received("m", "r", "{}", "g", 3)  # after the block: not counted
    per = counts.per(1)
    assert (per["records"], per["frozen_dataclasses"]) == (2, 1)
    assert vars(Received)["__init__"] is received_init
    assert ContinuationConfig.__init__ is frozen
