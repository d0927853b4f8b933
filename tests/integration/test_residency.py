"""Data residency against two real databases standing for two regions (default and eu)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import asyncpg
import pytest
from prometheus_client import REGISTRY as METRICS

from phasegate import Workflow
from phasegate.envelope import start_message
from phasegate.orchestrator.purge import purge_by_classification
from phasegate.orchestrator.starter import StartError, start_workflow
from phasegate.residency import (
    RegionalStore,
    ResidencyError,
    StoreRouter,
    residency,
    stores_from_settings,
)
from phasegate.store import PhaseCommit, Slot, create_pool
from phasegate.workflow import Registry
from tests.conftest import throwaway_database
from tests.helpers import (
    ROOT,
    all_done,
    fetchval,
    make_settings,
    queue_for,
    running_worker,
    send_raw,
    wait_for,
)

resident = Workflow("resident")


@resident.phase("collect")
async def collect(ctx, state):
    return {**state, "collected": True}


@resident.phase("report")
async def report(ctx, state):
    return {**state, "reported": True}


REGISTRY = Registry([resident])
TABLES = ("workflow_runs", "checkpoints", "outbox", "quarantine")


@pytest.fixture
def eu_url(pg_server_dsn: str, template_db: str) -> Iterator[str]:
    """A second migrated database: the eu region's store."""
    with throwaway_database(pg_server_dsn, "phasegate_eu", template_db) as url:
        yield url


@pytest.fixture
def settings(database_url, eu_url, queue_pair, sqs_endpoint):
    return make_settings(database_url, queue_pair, sqs_endpoint,
                         stores=json.dumps({"default": database_url, "eu": eu_url}))


async def counts(dsn: str) -> dict[str, int]:
    return {t: int(await fetchval(dsn, f"SELECT count(*) FROM {t}")) for t in TABLES}


def audit_count(region: str, classification: str) -> float:
    value = METRICS.get_sample_value("phasegate_checkpoint_writes_total", {
        "region": region, "classification": classification, "kind": "phase"})
    return value or 0.0


async def open_router(settings) -> tuple[StoreRouter, asyncpg.Pool, object]:
    from contextlib import AsyncExitStack

    stack = AsyncExitStack()
    pool = await create_pool(settings.database_url, min_size=1, max_size=2)
    stack.push_async_callback(pool.close)
    router = await stores_from_settings(settings, pool, stack, pool_max=2)
    assert isinstance(router, StoreRouter)
    return router, pool, stack


async def test_a_regulated_run_in_eu_lands_only_in_eus_database(settings, eu_url):
    before = audit_count("eu", "regulated")
    router, _, stack = await open_router(settings)
    try:
        async with queue_for(settings) as queue:
            started = await start_workflow(router, queue, workflow=resident,
                                           input={"citizen": "x"}, classification="regulated",
                                           region="eu")
    finally:
        await stack.aclose()  # type: ignore[attr-defined]
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(eu_url, [started.workflow_id]), what="eu run done")
    eu = await counts(eu_url)
    assert eu["workflow_runs"] == 1 and eu["checkpoints"] == 2 and eu["quarantine"] == 0
    assert await fetchval(eu_url, "SELECT region || '/' || classification FROM workflow_runs"
                          ) == "eu/regulated"
    # Nothing about the run in the default store: no row, no checkpoint, no outbox message.
    assert await counts(settings.database_url) == dict.fromkeys(TABLES, 0)
    assert audit_count("eu", "regulated") - before == 2


async def test_a_producer_start_message_with_a_region_is_routed_to_that_store(settings, eu_url):
    message = start_message("eu-prod-1", "resident", {"n": 1}).model_copy(
        update={"classification": "sensitive", "region": "eu"})
    await send_raw(settings, message.to_json(), group=message.group_id)
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(eu_url, ["eu-prod-1"]), what="eu run done")
    assert (await counts(settings.database_url))["workflow_runs"] == 0
    # Successors carried the region hint: every phase ran against eu.
    bodies = [json.loads(b) for b in await _column(eu_url, "SELECT body FROM outbox")]
    assert bodies and all(b["region"] == "eu" for b in bodies)


async def _column(dsn: str, sql: str) -> list[str]:
    connection = await asyncpg.connect(dsn)
    try:
        return [r[0] for r in await connection.fetch(sql)]
    finally:
        await connection.close()


async def test_a_write_to_the_wrong_store_is_refused_by_the_store_layer(settings, eu_url):
    router, _pool, stack = await open_router(settings)
    try:
        async with queue_for(settings) as queue:
            started = await start_workflow(router, queue, workflow=resident, input={},
                                           classification="sensitive", region="eu")
        wid = started.workflow_id
        default, eu = router.stores["default"], router.stores["eu"]
        assert isinstance(default, RegionalStore) and isinstance(eu, RegionalStore)
        assert (await eu.load_for_phase(wid)) is not None
        commit = PhaseCommit(workflow_id=wid, branch="main", seq=0, phase="collect",
                             schema_version=1, state_json="{}", state_hash="0" * 64,
                             next_phase="report", status="running", worker_id="test")
        with pytest.raises(ResidencyError, match="holds no run"):
            await default.commit_phase(commit)
        with pytest.raises(ResidencyError):
            await default.record_failure(wid, 0, "x", 5)
        with pytest.raises(ResidencyError):
            await default.emergency_checkpoint(workflow_id=wid, branch="main", seq=0,
                                               phase="collect", schema_version=1, state={},
                                               worker_id="test")
        # A start for a region goes nowhere but its own store, even when called directly.
        eu_start = start_message("direct-1", "resident", {}).model_copy(
            update={"classification": "regulated", "region": "eu"})
        with pytest.raises(ResidencyError, match="cannot be written"):
            await default.start_and_load(eu_start, 1, "collect")
        with pytest.raises(ResidencyError, match="cannot be written"):
            await eu.start_and_load(start_message("direct-2", "resident", {}), 1, "collect")
        # So does a keyed start, which creates its run, takes a slot and loads it (0034).
        with pytest.raises(ResidencyError, match="cannot be written"):
            await default.start_keyed(eu_start, 1, "collect", Slot(
                key="k", limit=1, dedup_id="d", group_id=eu_start.group_id, body="{}",
                rate=None, window_s=None))
        # A database holding a run of another region (a DSN mapped to the wrong region) is
        # caught by the region check, not just by the run's absence.
        mislabelled = RegionalStore(eu.pool, "us", strict=True)
        with pytest.raises(ResidencyError, match="belongs to region 'eu'"):
            await mislabelled.commit_phase(commit)
    finally:
        await stack.aclose()  # type: ignore[attr-defined]
    assert (await counts(settings.database_url))["workflow_runs"] == 0
    assert (await counts(eu_url))["checkpoints"] == 0
    assert residency("regulated", "eu").store_region == "eu"


async def test_a_start_for_a_region_without_a_store_is_refused_and_nothing_is_written(
        settings, eu_url):
    router, _, stack = await open_router(settings)
    try:
        async with queue_for(settings) as queue:
            with pytest.raises(StartError, match="no store is configured for region 'us'"):
                await start_workflow(router, queue, workflow=resident, input={"a": 1},
                                     classification="regulated", region="us")
            with pytest.raises(StartError, match="needs a region"):
                await start_workflow(router, queue, workflow=resident, input={"a": 1},
                                     classification="sensitive")
    finally:
        await stack.aclose()  # type: ignore[attr-defined]
    # A producer's start message for that region: quarantined, no run anywhere.
    message = start_message("us-1", "resident", {"a": 1}).model_copy(
        update={"classification": "regulated", "region": "us"})
    await send_raw(settings, message.to_json(), group=message.group_id)
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: _quarantined(settings.database_url), what="quarantined")
    reason = await fetchval(settings.database_url, "SELECT reason FROM quarantine")
    assert reason.startswith("unknown_region: no store is configured for region 'us'")
    assert (await counts(settings.database_url))["workflow_runs"] == 0
    assert await counts(eu_url) == dict.fromkeys(TABLES, 0)


async def _quarantined(dsn: str) -> bool:
    return int(await fetchval(dsn, "SELECT count(*) FROM quarantine")) > 0


async def test_a_single_store_deployment_refuses_regional_starts(database_url, queue_pair,
                                                                 sqs_endpoint):
    settings = make_settings(database_url, queue_pair, sqs_endpoint)
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        async with queue_for(settings) as queue:
            store = RegionalStore(pool)
            with pytest.raises(StartError, match="cannot be written"):
                await start_workflow(store, queue, workflow=resident, input={},
                                     classification="regulated", region="eu")
            ok = await start_workflow(store, queue, workflow=resident, input={},
                                      classification="public")
    finally:
        await pool.close()
    async with running_worker(settings, REGISTRY):
        await wait_for(lambda: all_done(database_url, [ok.workflow_id]), what="run done")
    assert await fetchval(database_url, "SELECT classification FROM workflow_runs") == "public"


async def test_purge_applies_each_classifications_retention(database_url):
    connection = await asyncpg.connect(database_url)
    try:
        for i, (classification, age_days) in enumerate([
                ("public", 10), ("public", 1), ("regulated", 10), ("regulated", 40),
                ("internal", 400)]):
            await connection.execute(
                "INSERT INTO workflow_runs (workflow_id, workflow, schema_version, status, "
                "classification, region, finished_at) VALUES ($1, 'w', 1, 'completed', $2, $3, "
                "now() - make_interval(days => $4))", f"r{i}", classification,
                "eu" if classification == "regulated" else None, age_days)
    finally:
        await connection.close()
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        ages = {"public": timedelta(days=7), "regulated": timedelta(days=30)}
        dry = await purge_by_classification(pool, ages, dry_run=True)
        assert {k: r.runs for k, r in dry.items()} == {"public": 1, "regulated": 1}
        done = await purge_by_classification(pool, ages)
        assert {k: r.runs for k, r in done.items()} == {"public": 1, "regulated": 1}
    finally:
        await pool.close()
    left = await _column(database_url, "SELECT workflow_id FROM workflow_runs ORDER BY 1")
    assert left == ["r1", "r2", "r4"]  # young public, young regulated, internal (no age set)


@pytest.mark.parametrize("value, problem", [
    ("not json", "must be a JSON object"),
    ('{"eu": "mysql://x"}', "must be a postgresql:// URL"),
    ('{"EU!": "postgresql://x"}', "region 'EU!'"),
])
def test_a_bad_stores_setting_exits_2_naming_the_variable(value, problem):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHASEGATE_")}
    env.update({"PHASEGATE_STORES": value, "PHASEGATE_DATABASE_URL": "postgresql://x/y",
                "PYTHONPATH": str(ROOT)})
    result = subprocess.run([sys.executable, "-m", "phasegate.cli", "migrate"], env=env,
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "PHASEGATE_STORES" in result.stderr and problem in result.stderr
    assert "postgresql://x" not in result.stderr  # a DSN (and its password) is never echoed
