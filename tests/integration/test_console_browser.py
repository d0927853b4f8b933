"""The console in a real browser: Debian's Chromium, driven by Playwright, against a real
orchestrator (uvicorn on a port), a real worker, PostgreSQL and the SQS server over HTTP.

One walk through the console, in the order a person would take it: log in, watch a run
appear and complete without reloading, open its timeline, cancel a running run, approve a run
awaiting review, resume a run waiting for a signal with the signal form, find a quarantined
message; then a viewer, who sees no buttons, and a forged POST without the CSRF token, which is
refused, and the fleet page with the live worker and its watchdog state. Screenshots go to
$PHASEGATE_ARTIFACTS/console (else the test's tmp dir); docs/assets/console-*.png are some.

The browser is /usr/bin/chromium (scripts/bootstrap.sh installs Debian's package); nothing
downloads a browser. Without it the test is skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from phasegate.client import AsyncClient
from phasegate.orchestrator.embedded import free_port
from phasegate.orchestrator.server import OrchestratorOptions, running_orchestrator
from phasegate.settings import Settings
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import (
    fetch,
    fetchval,
    make_settings,
    running_worker,
    send_raw,
    wait_for,
    write_tokens,
)
from tests.workflows_console import review
from tests.workflows_waits import signalled

CHROMIUM = os.environ.get("PHASEGATE_CHROMIUM", "/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    shutil.which(CHROMIUM) is None,
    reason=f"no Chromium at {CHROMIUM}: apt-get install chromium (scripts/bootstrap.sh does)")
# Every wait in the browser is bounded; the worker runs these phases in milliseconds.
STEP_MS = 30_000


REGISTRY = Registry([workflows.chain, workflows.gated, review, signalled])


def artifacts(tmp_path: Path) -> Path:
    root = os.environ.get("PHASEGATE_ARTIFACTS")
    folder = Path(root) / "console" if root else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        # --no-sandbox: the tests run as root in a container, where Chromium's sandbox
        # cannot start; the pages are our own.
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield browser
        finally:
            await browser.close()


async def log_in(browser: Any, url: str, token: str) -> Any:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(STEP_MS)
    page = await context.new_page()
    await page.goto(url + "/")
    assert "/ui/login" in page.url  # not logged in yet: sent to the login page
    await page.fill("#token", token)
    await page.click("button[type=submit]")
    await page.wait_for_selector("h1:has-text('Runs')")
    return page


async def status_of(dsn: str, workflow_id: str) -> str | None:
    value = await fetchval(dsn, "SELECT status FROM workflow_runs WHERE workflow_id = $1",
                           workflow_id)
    return str(value) if value is not None else None


@pytest.mark.timeout(170)
async def test_console_in_chromium(database_url: str, queue_pair: tuple[str, str],
                                   sqs_endpoint: str, tmp_path: Path) -> None:
    workflows.LEDGER_DSN = database_url
    tokens = write_tokens(tmp_path / "tokens", {"val": "viewer", "otto": "operator"})
    settings: Settings = make_settings(database_url, queue_pair, sqs_endpoint,
                                       api_auth="tokens",
                                       api_tokens_file=str(tmp_path / "tokens"))
    shots = artifacts(tmp_path)
    options = OrchestratorOptions(host="127.0.0.1", port=free_port(), exporter_interval_s=1.0)
    async with running_orchestrator(settings, REGISTRY, options) as orchestrator, \
            running_worker(settings, REGISTRY), chromium() as browser, \
            AsyncClient(orchestrator.url, token=tokens["otto"]) as api:
        url = orchestrator.url
        page = await log_in(browser, url, tokens["otto"])

        # A run appears in the live list and completes there, without a reload.
        run = await api.start("chain", {"n": 1}, workflow_id="run-chain")
        row = page.locator('tr[data-run="run-chain"]')
        await row.locator("text=completed").wait_for()
        assert page.url.rstrip("/") == url  # the list refreshed itself

        # Its timeline: three committed phases, and the branch graph as an SVG.
        await row.locator("a").click()
        await page.wait_for_selector("table.timeline")
        phases = await page.locator("table.timeline tbody tr td:nth-child(2)").all_inner_texts()
        assert phases == ["fetch", "transform", "publish"]
        assert await page.locator("svg.dag g.node").count() == 3
        assert (await api.get(run.workflow_id)).status == "completed"

        # Cancel a running run from its page.
        gated = await api.start("gated", {"gate": "never-opened"}, workflow_id="run-held")
        await wait_for(lambda: _is(database_url, gated.workflow_id, "running", phase="held"),
                       what="the gated run reaches its held phase")
        await page.goto(f"{url}/ui/runs/run-held")
        await page.fill("input[aria-label='reason for cancel']", "not needed")
        await page.click("button.act.cancel")
        await page.wait_for_selector("#run-status:has-text('cancelled')")
        assert await status_of(database_url, "run-held") == "cancelled"
        await fetch(database_url, "INSERT INTO test_gates (name) VALUES ('never-opened')")

        # Approve a run awaiting review; it then completes.
        pending = await api.start("review", {}, workflow_id="run-review")
        settled = await api.wait(pending.workflow_id, timeout=60)
        assert settled.status == "awaiting_review"
        await page.goto(f"{url}/ui/runs/run-review")
        await page.screenshot(path=str(shots / "console-run-review.png"), full_page=True)
        await page.click("button.act.approve")
        await page.wait_for_selector(".flash.ok:has-text('approve')")
        assert (await api.wait("run-review", timeout=60)).status == "completed"
        await page.goto(url + "/")
        await page.wait_for_selector('tr[data-run="run-review"]')
        await page.screenshot(path=str(shots / "console-runs.png"), full_page=True)

        # A run waiting for a signal: the form sends it, the run resumes and completes.
        await api.start("signalled", {"timeout_s": 600}, workflow_id="run-signal")
        await wait_for(lambda: _is(database_url, "run-signal", "waiting", phase="act"),
                       what="the run waits for its signal")
        await page.goto(f"{url}/ui/runs/run-signal")
        await page.wait_for_selector("#run-wait:has-text('approval')")
        assert await page.input_value("input[aria-label='signal name']") == "approval"
        await page.fill("textarea[aria-label='signal payload']", '{"approved": "yes"}')
        await page.screenshot(path=str(shots / "console-run-signal.png"), full_page=True)
        await page.click("button.act.signal")
        await page.wait_for_selector(".flash.ok:has-text('Signal sent')")
        assert (await api.wait("run-signal", timeout=60)).status == "completed"
        await page.reload()
        await page.wait_for_selector("tr.wait:has-text('signal approval')")
        state = await fetchval(database_url, "SELECT state->>'signal' FROM checkpoints WHERE "
                               "workflow_id = 'run-signal' AND seq = 1 AND kind = 'phase'")
        assert state == '{"approved": "yes"}'

        # A poison message: quarantined by the worker, listed with its reason.
        await send_raw(settings, "this is not an envelope", group="poison")
        await wait_for(lambda: _quarantined(database_url), what="the poison quarantined")
        await page.goto(f"{url}/ui/stalls")
        reason = await page.locator("table.quarantine td.reason").first.inner_text()
        assert reason.startswith("not_json:"), reason
        assert await page.locator("text=producer must send it again").count() >= 1
        await page.screenshot(path=str(shots / "console-quarantine.png"), full_page=True)

        # A forged POST from this very origin but without the CSRF token is refused.
        status = await page.evaluate(
            "fetch('/ui/runs/run-chain/cancel', {method: 'POST', body: new URLSearchParams("
            "{reason: 'forged'})}).then(r => r.status)")
        assert status == 403
        assert await fetchval(database_url, "SELECT count(*) FROM control_actions "
                              "WHERE reason = 'forged'") == 0

        # A viewer sees the same run pages without a single action button.
        viewer = await log_in(browser, url, tokens["val"])
        await viewer.goto(f"{url}/ui/runs/run-review")
        await viewer.wait_for_selector("text=may look, not act")
        await viewer.goto(f"{url}/ui/stalls")
        assert await viewer.locator("button.act").count() == 0
        await viewer.goto(f"{url}/ui/runs/run-signal")
        assert await viewer.locator("#signal-form").count() == 0
        # The fleet page: the one worker of this test, live, with its watchdog's state.
        await viewer.goto(f"{url}/ui/fleet")
        await viewer.wait_for_selector("#queue-visible")
        shown = await viewer.locator("table.workers tr[data-worker] .watchdog").all_inner_texts()
        reported = await fetchval(database_url, "SELECT watchdog FROM worker_presence "
                                  "WHERE stopped_at IS NULL")
        assert shown == [reported] and reported in ("ok", "off"), (shown, reported)
        await viewer.screenshot(path=str(shots / "console-fleet.png"), full_page=True)

    for name in ("console-runs.png", "console-run-review.png", "console-quarantine.png",
                 "console-fleet.png", "console-run-signal.png"):
        assert (shots / name).stat().st_size > 10_000, name


async def _is(dsn: str, workflow_id: str, status: str, *, phase: str) -> bool:
    rows = await fetch(dsn, "SELECT status, current_phase FROM workflow_runs "
                       "WHERE workflow_id = $1", workflow_id)
    return bool(rows) and (rows[0]["status"], rows[0]["current_phase"]) == (status, phase)


async def _quarantined(dsn: str) -> bool:
    return bool(await fetchval(dsn, "SELECT count(*) FROM quarantine"))
