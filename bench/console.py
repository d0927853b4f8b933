"""The console's page times on a 100,000-run database: the server's answer and a real browser's
page load.

    .venv/bin/python bench/console.py [--runs 100000] [--checkpoints-per-run 5]
                                      [--iterations 50] [--dsn postgresql://...] [--no-browser]

Fills a throwaway database exactly as bench/queries.py does (the same status mix), starts the
real orchestrator (uvicorn on a port, a moto server for its queue, a tokens file), logs in with
a cookie like a browser, then times each page one request at a time: the time to the full HTML
answer (httpx), p50/p99. With Debian's Chromium at /usr/bin/chromium it also loads the runs list
in the browser and reads the Navigation Timing ``loadEventEnd`` (HTML, stylesheet, script and
layout). Writes bench/results/console-<timestamp>.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.queries import fill, percentile, server_dsn, with_database  # noqa: E402
from phasegate.migrate import migrate  # noqa: E402
from phasegate.orchestrator.auth import new_token, token_line  # noqa: E402
from phasegate.orchestrator.embedded import EmbeddedSqs, free_port, local_aws_env  # noqa: E402
from phasegate.orchestrator.server import (  # noqa: E402
    OrchestratorOptions,
    running_orchestrator,
)
from phasegate.queue import create_fifo_queue_pair  # noqa: E402
from phasegate.settings import Settings  # noqa: E402
from phasegate.workflow import Registry  # noqa: E402

CHROMIUM = "/usr/bin/chromium"


async def queues(endpoint: str) -> tuple[str, str]:
    import aioboto3

    session = aioboto3.Session()
    async with session.client("sqs", endpoint_url=endpoint, region_name="us-east-1") as sqs:
        return await create_fifo_queue_pair(sqs, f"bench{uuid.uuid4().hex[:8]}",
                                            visibility_timeout_s=30, max_receive_count=5)


async def time_pages(client: httpx.AsyncClient, paths: dict[str, str],
                     iterations: int) -> dict[str, dict[str, float]]:
    results = {}
    for name, path in paths.items():
        samples = []
        for _ in range(iterations):
            started = time.perf_counter()
            response = await client.get(path)
            samples.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise SystemExit(f"{path}: HTTP {response.status_code}")
        results[name] = {"p50_ms": round(percentile(samples, 0.5), 1),
                         "p99_ms": round(percentile(samples, 0.99), 1),
                         "mean_ms": round(statistics.fmean(samples), 1),
                         "bytes": len(response.content)}
    return results


async def browser_load(url: str, token: str, iterations: int) -> dict[str, float] | None:
    if shutil.which(CHROMIUM) is None:
        return None
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM,
                                                   args=["--no-sandbox"])
        page = await browser.new_page()
        await page.goto(url + "/ui/login")
        await page.fill("#token", token)
        await page.click("button[type=submit]")
        await page.wait_for_selector("table.runs")
        samples = []
        for _ in range(iterations):
            await page.goto(url + "/", wait_until="load")
            samples.append(await page.evaluate(
                "performance.getEntriesByType('navigation')[0].loadEventEnd"))
        await browser.close()
    return {"p50_ms": round(percentile(samples, 0.5), 1),
            "p99_ms": round(percentile(samples, 0.99), 1), "iterations": iterations}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    # The moto server takes any credentials; real ones from the environment are kept.
    os.environ.update({k: v for k, v in local_aws_env().items() if k not in os.environ})
    admin_dsn, embedded = await server_dsn(args.dsn)
    name = f"phasegate_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = with_database(admin_dsn, name)
    token = new_token()
    try:
        await migrate(dsn)
        print(f"filling {args.runs} runs ...", file=sys.stderr)
        data = await fill(dsn, args.runs, args.checkpoints_per_run)
        sample = await admin_fetch(dsn, "SELECT workflow_id FROM workflow_runs "
                                        "WHERE status = 'running' LIMIT 1")
        with tempfile.TemporaryDirectory() as tmp, EmbeddedSqs() as sqs:
            tokens = Path(tmp) / "tokens"
            tokens.write_text(token_line("bench", ["viewer"], token) + "\n")
            queue_url, dlq_url = await queues(sqs.endpoint_url)
            settings = Settings(database_url=dsn, queue_url=queue_url, dlq_url=dlq_url,
                                sqs_endpoint_url=sqs.endpoint_url, aws_region="us-east-1",
                                api_auth="tokens", api_tokens_file=str(tokens),
                                log_level="warning")
            options = OrchestratorOptions(host="127.0.0.1", port=free_port(), relay=False)
            async with running_orchestrator(settings, Registry(), options) as orchestrator, \
                    httpx.AsyncClient(base_url=orchestrator.url, timeout=30) as client:
                login = await client.post("/ui/login", data={"token": token})
                assert login.status_code == 303, login.text
                first = await client.get("/")
                cursor = first.text.split("cursor=", 1)[1].split('"', 1)[0]
                paths = {"runs list (/, 50 rows, counts)": "/",
                         "runs list, live part (auto-refresh)": "/?fragment=live",
                         "runs list, 200 rows": "/?limit=200",
                         "runs list, status=failed": "/?status=failed",
                         "runs list, page 2 (cursor)": f"/?limit=50&cursor={cursor}",
                         "a run (timeline + graph)": f"/ui/runs/{sample}",
                         "stalls + quarantine": "/ui/stalls",
                         "fleet": "/ui/fleet"}
                print(f"timing {args.iterations} requests per page ...", file=sys.stderr)
                pages = await time_pages(client, paths, args.iterations)
                browser = None if args.no_browser else await browser_load(
                    orchestrator.url, token, min(args.iterations, 20))
        version = await admin.fetchval("SHOW server_version")
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        if embedded is not None:
            embedded.stop()
    return {"when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"python": platform.python_version(), "postgres": version,
                        "cpus": os.cpu_count(), "platform": platform.platform()},
            "data": data, "iterations": args.iterations, "pages": pages,
            "browser_runs_list_load": browser}


async def admin_fetch(dsn: str, sql: str) -> str:
    connection = await asyncpg.connect(dsn)
    try:
        return str(await connection.fetchval(sql))
    finally:
        await connection.close()


def markdown(report: dict[str, Any]) -> str:
    lines = ["| page | p50 ms | p99 ms | bytes |", "|---|---:|---:|---:|"]
    for name, r in report["pages"].items():
        lines.append(f"| {name} | {r['p50_ms']} | {r['p99_ms']} | {r['bytes']} |")
    if report["browser_runs_list_load"]:
        b = report["browser_runs_list_load"]
        lines.append(f"| runs list in Chromium (loadEventEnd) | {b['p50_ms']} | "
                     f"{b['p99_ms']} | |")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--checkpoints-per-run", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--no-browser", action="store_true")
    arguments = parser.parse_args()
    report = asyncio.run(main(arguments))
    out = ROOT / "bench" / "results" / f"console-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    print(f"\n{report['data']} · written to {out.relative_to(ROOT)}")
