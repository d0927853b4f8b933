"""The console over HTTP (no browser): login cookie, CSRF, roles per page and per action, the
quarantine redrive, the signal form, the fleet page's workers and message ages, the timeline's
failed attempts and waits, bad input, and pages on an empty and on a 100,000-run database.

The app runs in-process through httpx's ASGI transport; PostgreSQL and the SQS server behind
it are real. tests/integration/test_console_browser.py drives the same pages in Chromium.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from phasegate.orchestrator.api import Services, create_app
from phasegate.orchestrator.auth import TokenFile
from phasegate.orchestrator.console_session import COOKIE
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.fleet import FleetView
from phasegate.orchestrator.relay import Relay
from phasegate.presence import PresenceReport, report
from phasegate.queue import SqsQueue
from phasegate.settings import Settings
from phasegate.store import Store, create_pool
from phasegate.workflow import Registry
from tests import workflows
from tests.helpers import (
    all_done,
    fetch,
    fetchval,
    make_settings,
    queue_for,
    running_worker,
    wait_for,
    write_tokens,
)
from tests.workflows_waits import signalled, timed

REGISTRY = Registry([workflows.chain, workflows.gated, workflows.flaky, signalled, timed])
ROLES = {"val": "viewer", "otto": "operator", "ada": "admin"}
CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')


@dataclass
class Console:
    app: object
    tokens: dict[str, str]
    settings: Settings
    queue: SqsQueue

    @property
    def dsn(self) -> str:
        return self.settings.database_url or ""

    def browser(self) -> httpx.AsyncClient:
        """A client that keeps cookies, like a browser (no bearer header)."""
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),  # type: ignore[arg-type]
                                 base_url="http://console.test", follow_redirects=False)

    @asynccontextmanager
    async def session(self, name: str) -> AsyncIterator[httpx.AsyncClient]:
        async with self.browser() as client:
            response = await client.post("/ui/login", data={"token": self.tokens[name],
                                                            "next": "/"})
            assert response.status_code == 303, response.text
            yield client


@pytest.fixture
def settings(database_url: str, queue_pair: tuple[str, str], sqs_endpoint: str) -> Settings:
    workflows.LEDGER_DSN = database_url
    return make_settings(database_url, queue_pair, sqs_endpoint)


@pytest.fixture
async def console(settings: Settings, tmp_path: Path) -> AsyncIterator[Console]:
    tokens = write_tokens(tmp_path / "tokens", ROLES)
    pool = await create_pool(settings.database_url or "", min_size=1, max_size=4)
    try:
        async with queue_for(settings) as queue:
            app = create_app(Services(
                control=Control(pool, queue, REGISTRY, actor="api"), queue=queue,
                fleet=FleetView(None, reason="not running in a Kubernetes cluster"),
                auth=TokenFile(tmp_path / "tokens")))
            yield Console(app, tokens, settings, queue)
    finally:
        await pool.close()


async def add_run(dsn: str, workflow_id: str, status: str, phase: str | None = "held",
                  workflow: str = "gated", seq: int = 1) -> None:
    await fetch(dsn, "INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, "
                "current_phase, schema_version) VALUES ($1, $2, $3, $4, $5, 1)",
                workflow_id, workflow, status, seq, phase)


def csrf_of(html: str) -> str:
    match = CSRF.search(html)
    assert match, "no CSRF field on the page"
    return match.group(1)


async def test_login_sets_a_strict_httponly_cookie_and_logout_clears_it(
        console: Console) -> None:
    async with console.browser() as client:
        away = await client.get("/ui/runs/x")
        assert away.status_code == 303 and away.headers["location"].startswith("/ui/login")
        bad = await client.post("/ui/login", data={"token": "pgt_not-a-token"})
        assert bad.status_code == 401 and "not valid" in bad.text
        assert COOKIE not in client.cookies
        good = await client.post("/ui/login", data={"token": console.tokens["val"],
                                                    "next": "//evil.example/"})
        assert good.status_code == 303 and good.headers["location"] == "/"
        cookie = good.headers["set-cookie"]
        assert f"{COOKIE}=" in cookie and "HttpOnly" in cookie
        assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
        assert "Secure" not in cookie  # plain http, PHASEGATE_CONSOLE_SECURE_COOKIE=auto
        page = await client.get("/")
        assert page.status_code == 200 and "val" in page.text
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        refused = await client.post("/ui/logout", data={})
        assert refused.status_code == 403
        out = await client.post("/ui/logout", data={"csrf": csrf_of(page.text)})
        assert out.status_code == 303
        assert 'Max-Age=0' in out.headers["set-cookie"] or "expires" in \
            out.headers["set-cookie"].lower()
        client.cookies.clear()
        assert (await client.get("/")).status_code == 303
        # Behind a TLS-terminating proxy the cookie is Secure.
        secure = await client.post("/ui/login", data={"token": console.tokens["val"]},
                                   headers={"x-forwarded-proto": "https"})
        assert secure.status_code == 303 and "Secure" in secure.headers["set-cookie"]


async def test_every_page_renders_on_an_empty_database(console: Console) -> None:
    async with console.session("ada") as client:
        for path in ("/", "/?fragment=live", "/ui/stalls", "/ui/fleet",
                     "/?status=failed&workflow=x&phase=y&limit=25"):
            response = await client.get(path)
            assert response.status_code == 200, (path, response.text[:500])
        assert "No runs" in (await client.get("/")).text
        assert "The quarantine is empty" in (await client.get("/ui/stalls")).text
        assert "not running in a Kubernetes cluster" in (await client.get("/ui/fleet")).text
        missing = await client.get("/ui/runs/nope")
        assert missing.status_code == 404 and "nope" in missing.text
        css = await client.get("/ui/static/console.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        assert (await client.get("/ui/static/../api.py")).status_code == 404


async def test_bad_input_is_a_clear_page_never_a_500(console: Console) -> None:
    async with console.session("val") as client:
        for path, status in [("/?limit=abc", 422), ("/?cursor=garbage", 422),
                             ("/?status=no-such-status", 422),
                             ("/ui/stalls?older_than=nan", 422),
                             ("/ui/stalls?older_than=-1", 422),
                             ("/ui/stalls?before=zz", 422),
                             ("/ui/runs/" + "x" * 300, 404)]:
            response = await client.get(path)
            assert response.status_code == status, (path, response.status_code)
            assert "text/html" in response.headers["content-type"]
        nul = await client.get("/ui/runs/a%00b")
        assert nul.status_code == 422
        huge = await client.post(f"/ui/quarantine/{2**70}/redrive", data={})
        assert huge.status_code == 422


async def test_a_viewer_sees_no_buttons_and_cannot_act(console: Console) -> None:
    await add_run(console.dsn, "r-review", "awaiting_review")
    async with console.session("val") as viewer:
        page = await viewer.get("/ui/runs/r-review")
        assert page.status_code == 200 and "awaiting_review" in page.text
        assert "/ui/runs/r-review/approve" not in page.text and "may look, not act" in page.text
        forged = await viewer.post("/ui/runs/r-review/approve",
                                   data={"csrf": csrf_of(page.text)})
        assert forged.status_code == 403 and "operator" in forged.text
    async with console.session("otto") as operator:
        page = await operator.get("/ui/runs/r-review")
        for action in ("approve", "reject", "cancel"):
            assert f"/ui/runs/r-review/{action}" in page.text
        assert "/merge" not in page.text  # admin only, and no open fork
    assert await fetchval(console.dsn, "SELECT status FROM workflow_runs") == "awaiting_review"
    assert await fetchval(console.dsn, "SELECT count(*) FROM control_actions") == 0


async def test_actions_need_the_csrf_token_and_the_same_origin(console: Console) -> None:
    await add_run(console.dsn, "r-run", "running", phase="before", seq=0)
    async with console.session("otto") as operator:
        page = await operator.get("/ui/runs/r-run")
        token = csrf_of(page.text)
        for data, headers in [({}, {}), ({"csrf": "0" * 64}, {}),
                              ({"csrf": token}, {"origin": "http://evil.example"})]:
            refused = await operator.post("/ui/runs/r-run/cancel", data=data, headers=headers)
            assert refused.status_code == 403 and "CSRF" in refused.text
        assert await fetchval(console.dsn, "SELECT status FROM workflow_runs") == "running"
        # The viewer's CSRF token is not the operator's: tokens are per session.
        async with console.session("val") as viewer:
            other = csrf_of((await viewer.get("/")).text)
        assert other != token
        done = await operator.post("/ui/runs/r-run/cancel",
                                   data={"csrf": token, "reason": "from the console"},
                                   headers={"origin": "http://console.test"})
        assert done.status_code == 303 and done.headers["location"].endswith("done=cancel")
        again = await operator.post("/ui/runs/r-run/cancel", data={"csrf": token})
        assert again.status_code == 409 and "cancelled" in again.text
    row = (await fetch(console.dsn, "SELECT action, actor, reason FROM control_actions"))[0]
    assert dict(row) == {"action": "cancel", "actor": "otto", "reason": "from the console"}
    assert await fetchval(console.dsn, "SELECT status FROM workflow_runs") == "cancelled"


KEY = re.compile(r'name="key" value="([0-9a-f]{32})"')


async def test_a_resubmitted_review_form_decides_once(console: Console) -> None:
    """The approve and reject forms carry one key per page view: the form sent twice (a double
    click, a browser's resubmit) decides once and lands on the run page both times."""
    await add_run(console.dsn, "r-twice", "awaiting_review")
    async with console.session("otto") as operator:
        page = await operator.get("/ui/runs/r-twice")
        keys = KEY.findall(page.text)
        assert len(keys) == 2 and keys[0] == keys[1]  # approve's and reject's form
        form = {"csrf": csrf_of(page.text), "key": keys[0], "reason": "ship it"}
        for _ in range(2):
            sent = await operator.post("/ui/runs/r-twice/approve", data=form)
            assert sent.status_code == 303 and sent.headers["location"].endswith("done=approve")
        # The run is running now: no review forms, and another key is refused as before.
        assert KEY.findall((await operator.get("/ui/runs/r-twice")).text) == []
        stale = await operator.post("/ui/runs/r-twice/reject",
                                    data={**form, "key": "0" * 32})
        assert stale.status_code == 409
    rows = await fetch(console.dsn, "SELECT action, reason FROM control_actions")
    assert [tuple(r) for r in rows] == [("approve", "ship it")]
    assert await fetchval(console.dsn, "SELECT idempotency_key FROM signals") == (
        "console:" + keys[0])


async def test_redrive_rebuilds_from_the_run_row_once(console: Console) -> None:
    await add_run(console.dsn, "r-failed", "failed", phase="held", seq=1)
    await fetch(console.dsn, "INSERT INTO quarantine (message_id, workflow_id, reason, "
                "body_bytes) VALUES ('m-1', 'r-failed', 'crashed: the transition crashed "
                "3 times', 120), ('m-2', NULL, 'unparseable: not JSON', 9)")
    async with console.session("val") as viewer:
        page = await viewer.get("/ui/stalls")
        assert "crashed: the transition crashed" in page.text
        assert "producer must send it again" in page.text  # m-2 names no run
        assert "/redrive" not in page.text  # a viewer gets no button
    async with console.session("otto") as operator:
        page = await operator.get("/ui/stalls")
        ids = dict(await fetch(console.dsn, "SELECT message_id, quarantine_id FROM quarantine"))
        assert f"/ui/quarantine/{ids['m-1']}/redrive" in page.text
        assert f"/ui/quarantine/{ids['m-2']}/redrive" not in page.text
        token = csrf_of(page.text)
        done = await operator.post(f"/ui/quarantine/{ids['m-1']}/redrive",
                                   data={"csrf": token})
        assert done.status_code == 303, done.text
        twice = await operator.post(f"/ui/quarantine/{ids['m-1']}/redrive",
                                    data={"csrf": token})
        assert twice.status_code == 409 and "already redriven by otto" in twice.text
        cannot = await operator.post(f"/ui/quarantine/{ids['m-2']}/redrive",
                                     data={"csrf": token})
        assert cannot.status_code == 409 and "producer must send it again" in cannot.text
    run = (await fetch(console.dsn, "SELECT status, epoch FROM workflow_runs"))[0]
    assert run["status"] == "running" and run["epoch"] == 1
    outbox = await fetch(console.dsn, "SELECT body, sent_at FROM outbox")
    assert len(outbox) == 1 and '"phase":"held"' in outbox[0]["body"].replace(" ", "")
    assert outbox[0]["sent_at"] is not None and (await console.queue.depth()).visible == 1
    assert await fetchval(console.dsn, "SELECT redriven_by FROM quarantine "
                          "WHERE message_id = 'm-1'") == "otto"


async def test_unknown_statuses_render_generically(console: Console) -> None:
    # Other statuses arrive with other features (waiting, queued): drop the rule as a newer
    # schema would widen it (migrations 0022, 0029), and the pages must still draw them.
    for trigger in ("workflow_runs_rules_on_insert", "workflow_runs_rules_on_status"):
        await fetch(console.dsn, f"DROP TRIGGER {trigger} ON workflow_runs")
    await add_run(console.dsn, "r-new", "snoozing", phase="held")
    async with console.session("ada") as client:
        listing = await client.get("/")
        assert listing.status_code == 200 and 'badge other">snoozing' in listing.text
        page = await client.get("/ui/runs/r-new")
        assert page.status_code == 200 and "snoozing" in page.text
        assert "/ui/runs/r-new/cancel" not in page.text  # no rule allows it: no button


async def test_a_waiting_run_shows_its_due_time_and_signal(console: Console) -> None:
    await add_run(console.dsn, "r-wait", "waiting", phase="held")
    due = await fetchval(console.dsn, "UPDATE workflow_runs SET due_at = now() + interval "
                         "'1 hour', waiting_for = 'approval' WHERE workflow_id = 'r-wait' "
                         "RETURNING due_at")
    async with console.session("ada") as client:
        page = await client.get("/ui/runs/r-wait")
    assert page.status_code == 200
    assert f'datetime="{due.isoformat()}"' in page.text
    assert f"{due.isoformat(timespec='seconds')}</time> (UTC)" in page.text
    assert "signal <code>approval</code>" in page.text


@pytest.mark.timeout(120)
async def test_pages_on_100k_runs(console: Console) -> None:
    await fetch(console.dsn, """
        INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, current_phase,
                                   schema_version, created_at, updated_at)
        SELECT 'wf_' || i, 'chain', (ARRAY['completed','running','failed'])[1 + i % 3], 1,
               'fetch', 1, now() - make_interval(secs => i), now() - make_interval(secs => i)
          FROM generate_series(1, 100000) AS i""")
    async with console.session("val") as client:
        first = await client.get("/?limit=200")
        assert first.status_code == 200 and "100000" in first.text
        assert first.text.count('<tr data-run="') == 200
        older = re.search(r'href="(/\?[^"]*cursor=[^"]+)"', first.text)
        assert older, "no link to the next page"
        second = await client.get(older.group(1).replace("&amp;", "&"))
        assert second.status_code == 200 and 'data-run="wf_201"' in second.text
        for path in ("/?status=failed", "/ui/stalls?older_than=0", "/ui/fleet"):
            assert (await client.get(path)).status_code == 200, path


async def add_waiting_run(dsn: str, workflow_id: str, signal: str | None = "approval") -> None:
    """A run parked at seq 1 by a wait, as commit_phase leaves it: its row due in an hour."""
    await fetch(dsn, "INSERT INTO workflow_runs (workflow_id, workflow, status, next_seq, "
                "current_phase, schema_version, due_at, waiting_for) VALUES ($1, 'signalled', "
                "'waiting', 1, 'act', 1, now() + interval '1 hour', $2)", workflow_id, signal)
    await fetch(dsn, "INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, body, "
                "due_at, wait_signal) VALUES ($1, 'main', 1, $1 || '-1', $1, $3, "
                "now() + interval '1 hour', $2)", workflow_id, signal,
                '{"v":1,"kind":"phase","workflow_id":"' + workflow_id + '","workflow":'
                '"signalled","seq":1,"phase":"act","branch":"main"}')


async def test_the_signal_form_is_for_operators_and_checks_its_json(console: Console) -> None:
    await add_waiting_run(console.dsn, "r-wait")
    async with console.session("val") as viewer:
        page = await viewer.get("/ui/runs/r-wait")
        assert page.status_code == 200 and "signal <code>approval</code>" in page.text
        assert "signal-form" not in page.text
        refused = await viewer.post("/ui/runs/r-wait/signal",
                                    data={"csrf": csrf_of(page.text), "name": "approval"})
        assert refused.status_code == 403 and "operator" in refused.text
    async with console.session("otto") as operator:
        page = await operator.get("/ui/runs/r-wait")
        assert 'id="signal-form"' in page.text and 'name="name" value="approval"' in page.text
        token = csrf_of(page.text)
        assert (await operator.post("/ui/runs/r-wait/signal", data={
            "name": "approval", "payload": "{}"})).status_code == 403  # no CSRF token
        bad = await operator.post("/ui/runs/r-wait/signal", data={
            "csrf": token, "name": "approval", "payload": '{"ok": tru}', "key": "k1"})
        # Refused with the reason, and what was typed is still there to fix.
        assert bad.status_code == 422 and "the payload is not valid JSON" in bad.text
        assert "{&#34;ok&#34;: tru}" in bad.text
        bad_name = await operator.post("/ui/runs/r-wait/signal", data={
            "csrf": token, "name": "no spaces", "payload": ""})
        assert bad_name.status_code == 422 and "signal name" in bad_name.text
        assert await fetchval(console.dsn, "SELECT count(*) FROM signals") == 0
        payload = '{"ok": true, "big": "' + "x" * 5000 + '"}'  # longer than a form field
        sent = await operator.post("/ui/runs/r-wait/signal", data={
            "csrf": token, "name": "approval", "payload": payload, "key": "k2"})
        assert sent.status_code == 303 and sent.headers["location"].endswith("done=signal")
        again = await operator.post("/ui/runs/r-wait/signal", data={
            "csrf": token, "name": "approval", "payload": payload, "key": "k2"})
        assert again.headers["location"].endswith("done=signal-duplicate")
    row = (await fetch(console.dsn, "SELECT name, payload::text, consumed_seq, actor "
                       "FROM signals"))
    assert len(row) == 1 and row[0]["consumed_seq"] == 1 and row[0]["actor"] == "otto"
    assert '"ok": true' in row[0]["payload"] and len(row[0]["payload"]) > 5000
    # The run's row is due now and on its way, as the API's signal leaves it.
    assert await fetchval(console.dsn, "SELECT sent_at IS NOT NULL AND due_at <= now() "
                          "FROM outbox WHERE workflow_id = 'r-wait'") is True


async def test_the_fleet_page_lists_live_workers_and_message_ages(console: Console) -> None:
    pool = console.app.state.services.control.pool  # type: ignore[attr-defined]
    await report(pool, PresenceReport(worker_id="w-00aa", uptime_s=600, interval_s=15,
                                      in_flight=3, concurrency=4, watchdog="pressure",
                                      flushes=2, last_flush_ago_s=40))
    await report(pool, PresenceReport(worker_id="w-00bb", uptime_s=5, interval_s=15,
                                      in_flight=0, concurrency=4, watchdog="off", flushes=0,
                                      last_flush_ago_s=None))
    await fetch(console.dsn, "UPDATE worker_presence SET last_seen = now() - interval "
                "'1 minute' WHERE worker_id = 'w-00bb'")  # missed two reports: not listed
    for wid, status in (("r-pend", "pending"), ("r-run", "running"), ("r-unsent", "running")):
        await add_run(console.dsn, wid, status, seq=0)
    await fetch(console.dsn, "INSERT INTO outbox (workflow_id, branch, seq, dedup_id, group_id, "
                "body, sent_at) VALUES ('r-pend', 'main', 0, 'd1', 'r-pend', '{}', now() - "
                "interval '120 seconds'), ('r-run', 'main', 0, 'd2', 'r-run', '{}', now() - "
                "interval '300 seconds'), ('r-unsent', 'main', 0, 'd3', 'r-unsent', '{}', NULL)")
    await add_waiting_run(console.dsn, "r-due", signal=None)
    await fetch(console.dsn, "UPDATE workflow_runs SET due_at = now() - interval '60 seconds' "
                "WHERE workflow_id = 'r-due'")
    ages = await console.app.state.services.control.views.message_ages()  # type: ignore[attr-defined]
    assert ages.not_started == 2 and 120 <= (ages.not_started_s or 0) < 180
    assert ages.uncommitted == 1 and 300 <= (ages.uncommitted_s or 0) < 360
    async with console.session("val") as viewer:
        page = await viewer.get("/ui/fleet")
    assert page.status_code == 200
    assert page.text.count("<tr data-worker=") == 1 and 'data-worker="w-00aa"' in page.text
    assert 'watchdog">pressure</span>' in page.text and "3 of 4" in page.text
    assert re.search(r'id="age-not-started"[^>]*>2m \d+s', page.text), page.text
    assert "ApproximateAgeOfOldestMessage" in page.text


async def test_the_timeline_shows_failed_attempts_timers_and_signal_waits(
        console: Console) -> None:
    settings = console.settings
    control = console.app.state.services.control  # type: ignore[attr-defined]
    # The timers are the orchestrator's relay's to send.
    relay = Relay(store=Store(control.pool), queue=console.queue, after_s=0.5, interval_s=0.1)
    relaying = asyncio.create_task(relay.run())
    async with running_worker(settings, REGISTRY), console.session("otto") as operator:
        for body in ({"workflow": "flaky", "input": {"fail_times": 2}, "id": "t-flaky"},
                     {"workflow": "timed", "input": {"wait_s": 0.2}, "id": "t-timed"},
                     {"workflow": "signalled", "input": {"timeout_s": 600}, "id": "t-sig"}):
            await control.start(body["workflow"], body["input"], workflow_id=body["id"])

        async def waiting() -> bool:
            return await fetchval(console.dsn, "SELECT status FROM workflow_runs WHERE "
                                  "workflow_id = 't-sig'") == "waiting"

        await wait_for(waiting, what="the signalled run waits")
        page = await operator.get("/ui/runs/t-sig")
        assert 'class="wait current"' in page.text and "times out in" in page.text
        sent = await operator.post("/ui/runs/t-sig/signal", data={
            "csrf": csrf_of(page.text), "name": "approval", "payload": '{"go": 1}'})
        assert sent.status_code == 303
        await wait_for(lambda: all_done(console.dsn, ["t-flaky", "t-timed", "t-sig"]),
                       what="all three runs completed")
        flaky = (await operator.get("/ui/runs/t-flaky")).text
        timed_page = (await operator.get("/ui/runs/t-timed")).text
        signal_page = (await operator.get("/ui/runs/t-sig")).text
    relay.stop()
    await asyncio.wait_for(relaying, timeout=30)
    attempts = await fetch(console.dsn, "SELECT attempt, outcome, phase, error FROM "
                           "phase_attempts WHERE workflow_id = 't-flaky' ORDER BY attempt_id")
    assert [(a["attempt"], a["outcome"], a["phase"]) for a in attempts] == [
        (1, "retry", "try"), (2, "retry", "try")]
    assert all(a["error"].startswith("RuntimeError") for a in attempts)
    assert flaky.count('<tr class="attempt"') == 2 and "attempt 2 failed: RuntimeError" in flaky
    assert timed_page.count('<tr class="wait"') == 2 and "due after" in timed_page
    assert signal_page.count('<tr class="wait"') == 1 and "signal approval" in signal_page
    assert "the signal came after" in signal_page and "its phase started" in signal_page
    # Every finished wait kept when its next phase started; the happy path wrote no attempt.
    assert await fetchval(console.dsn, "SELECT count(*) FILTER (WHERE resumed_at IS NULL) "
                          "FROM outbox WHERE due_at IS NOT NULL") == 0
    assert await fetchval(console.dsn, "SELECT count(*) FROM phase_attempts WHERE "
                          "workflow_id <> 't-flaky'") == 0
