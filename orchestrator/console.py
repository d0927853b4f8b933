"""The web console: server-rendered pages at ``/`` and under ``/ui/`` (docs/how-to/console.md).

Plain HTML from Jinja2 templates shipped in the package, one stylesheet and one small script
(auto-refresh of the runs list), all served by the orchestrator itself: nothing is fetched
from elsewhere, so it works offline and in an air-gapped cluster. Every page reads through the
same control plane as the API and asks for the role the API asks for the same data or action
(gate.ROUTE_ROLES); the login is the API's token in a cookie (console_session.py).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path as FilePath
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import parse_qsl, quote, urlencode

import jinja2
import structlog
from fastapi import FastAPI, Path, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from phasegate.orchestrator import console_pages as pages
from phasegate.orchestrator import console_timeline as timelines
from phasegate.orchestrator.auth import AuthUnavailable, Caller
from phasegate.orchestrator.console_session import (
    CSRF_FIELD,
    SECURITY_HEADERS,
    TOKEN_PATTERN,
    clear_session,
    csrf_for,
    csrf_ok,
    same_origin,
    session_token,
    set_session,
)
from phasegate.orchestrator.console_svg import dag_svg
from phasegate.orchestrator.gate import required_role
from phasegate.orchestrator.quarantine import list_quarantine, redrive
from phasegate.orchestrator.views import ControlError, Invalid
from phasegate.presence import live_workers
from phasegate.signals import DECISIONS
from phasegate.sql import queries

if TYPE_CHECKING:
    from phasegate.orchestrator.api import Services

log = structlog.get_logger("phasegate.console")

HERE = FilePath(__file__).resolve().parent
STATIC_TYPES = {"console.css": "text/css; charset=utf-8",
                "console.js": "text/javascript; charset=utf-8"}
PAGE_SIZES = (25, 50, 100, 200)
REFRESH_S = 5
RUN_ACTIONS = ("cancel", "retry", "restart", "approve", "reject", "merge")
# What the signal form's redirect reports (run.html).
SIGNAL_OUTCOMES = ("signal", "signal-kept", "signal-duplicate")
MAX_FORM_FIELD = 1000
# Fields kept whole: a cut JSON payload could still parse, as something else. The gate
# bounds the whole body (PHASEGATE_API_MAX_BODY_BYTES).
WHOLE_FIELDS = frozenset({"payload"})


class Refused(Exception):
    """A console request refused with an HTTP status and a message for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["q"] = lambda value: quote(str(value), safe="")
    env.filters["age"] = pages.age
    env.filters["duration"] = pages.duration
    env.filters["until"] = timelines.until
    env.globals["badge"] = pages.badge
    env.globals["watchdog_badge"] = pages.watchdog_badge
    return env


def mount_console(app: FastAPI, services: Services) -> None:
    """Add the console's routes to the API's app (none of them is in the OpenAPI document)."""
    env = _environment()
    static = {name: (HERE / "static" / name).read_bytes() for name in STATIC_TYPES}
    control = services.control

    async def who(request: Request) -> tuple[Caller | None, str | None]:
        token = session_token(request)
        if token is None and services.auth.mode != "none":
            return None, None
        try:
            caller = await services.auth.authenticate(token)
        except AuthUnavailable as exc:
            raise Refused(503, str(exc)) from None
        if caller is not None:
            request.scope.setdefault("state", {})["console_caller"] = caller
        return caller, token

    def render(request: Request, template: str, status: int = 200, *,
               caller: Caller | None = None, token: str | None = None,
               **values: Any) -> HTMLResponse:
        html = env.get_template(template).render(
            caller=caller, csrf=csrf_for(token) if caller else "", csrf_field=CSRF_FIELD,
            auth_mode=services.auth.mode, request_path=request.url.path, **values)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    async def page(request: Request, role: str, build: Any) -> Response:
        """Authenticate, check ``role``, then render what ``build(caller, token)`` returns;
        a refusal or a control-plane error becomes a page with its status, never a 500."""
        try:
            caller, token = await who(request)
            if caller is None:
                target = quote(request.url.path + (f"?{request.url.query}"
                                                   if request.url.query else ""), safe="")
                return RedirectResponse(f"/ui/login?next={target}", 303)
            if not caller.may(role):
                raise Refused(403, f"this page needs the {role} role; {caller.name} has "
                                   f"{sorted(caller.roles)}")
            result: Response = await build(caller, token)
            return result
        except Refused as exc:
            return render(request, "error.html", exc.status, caller=None,
                          message=exc.message, title=str(exc.status))
        except ControlError as exc:
            return render(request, "error.html", exc.status_code, message=exc.reason,
                          title=str(exc.status_code))

    async def form_of(request: Request) -> dict[str, str]:
        body = (await request.body()).decode("utf-8", "replace")
        return {k: v if k in WHOLE_FIELDS else v[:MAX_FORM_FIELD]
                for k, v in parse_qsl(body, keep_blank_values=True)}

    async def checked_form(request: Request, caller: Caller, token: str | None,
                           role: str) -> dict[str, str]:
        form = await form_of(request)
        if not same_origin(request) or not csrf_ok(token, form.get(CSRF_FIELD)):
            raise Refused(403, "the form's CSRF token is missing or wrong: reload the page "
                               "and try again")
        if not caller.may(role):
            raise Refused(403, f"this needs the {role} role; {caller.name} has "
                               f"{sorted(caller.roles)}")
        return form

    # -- login ---------------------------------------------------------------------------------

    @app.get("/ui/login", include_in_schema=False)
    async def login_page(request: Request, next: str = "/") -> Response:
        return render(request, "login.html", next=_local(next), error=None)

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = await form_of(request)
        target = _local(form.get("next", "/"))
        token = form.get("token", "").strip()
        if not same_origin(request):
            return render(request, "login.html", 403, next=target,
                          error="this login form was posted from another site")
        try:
            caller = await services.auth.authenticate(token) \
                if TOKEN_PATTERN.fullmatch(token) else None
        except AuthUnavailable as exc:
            return render(request, "login.html", 503, next=target, error=str(exc))
        if caller is None:
            return render(request, "login.html", 401, next=target,
                          error="that token is not valid")
        response = RedirectResponse(target, 303)
        set_session(response, request, token, services.secure_cookie)
        log.info("console_login", caller=caller.name)
        return response

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        async def build(caller: Caller, token: str | None) -> Response:
            await checked_form(request, caller, token, "viewer")
            response = RedirectResponse("/ui/login", 303)
            clear_session(response, request, services.secure_cookie)
            return response

        return await page(request, "viewer", build)

    # -- runs ----------------------------------------------------------------------------------

    @app.get("/", include_in_schema=False)
    async def runs(request: Request) -> Response:
        params = request.query_params
        filters = {k: params.get(k) or None for k in ("status", "workflow", "phase")}
        cursor = params.get("cursor") or None

        async def build(caller: Caller, token: str | None) -> Response:
            limit = _int(params.get("limit"), 50, PAGE_SIZES)
            counts, listing = await asyncio.gather(
                control.views.runs_by_status(),
                control.views.list_runs(**filters, limit=limit, cursor=cursor))
            values: dict[str, Any] = dict(counts=sorted(counts.items()), total=sum(counts.values()),
                          runs=listing.runs, filters=filters, limit=limit,
                          next_url=("/?" + urlencode({**{k: v for k, v in filters.items()
                                                         if v}, "limit": limit,
                                                      "cursor": listing.next_cursor}))
                          if listing.next_cursor else None,
                          live=cursor is None, refresh_s=REFRESH_S)
            template = "runs_live.html" if params.get("fragment") == "live" else "runs.html"
            return render(request, template, 200, caller=caller, token=token, **values)

        return await page(request, "viewer", build)

    async def run_view(request: Request, caller: Caller, token: str | None,
                       workflow_id: str, *, status: int = 200,
                       signal_form: dict[str, Any] | None = None) -> Response:
        """The run page; ``signal_form``: a refused signal's fields and error, shown again."""
        show_state = request.query_params.get("state") == "1"
        scoped = await control.acting_as(caller.name).scoped(workflow_id)
        run = await scoped.views.get_run(workflow_id)
        history, actions, forks, retries, attempts, waits = await asyncio.gather(
            scoped.views.checkpoints(workflow_id, include_state=show_state,
                                     limit=timelines.MAX_TIMELINE, roles=caller.roles),
            scoped.views.actions(workflow_id), scoped.branches(workflow_id),
            timelines.retries_by_seq(scoped.pool, workflow_id),
            timelines.attempts_of(scoped.pool, workflow_id),
            timelines.waits_of(scoped.pool, workflow_id))
        run_json = run.model_dump(mode="json")
        checkpoints_json = [c.model_dump(mode="json") for c in history.checkpoints]
        open_forks = [f for f in forks if f["status"] == "open"]
        if signal_form is None and run.status == "waiting" and run.waiting_for \
                and caller.may(required_role("signal")):
            signal_form = {"name": run.waiting_for, "payload": "", "error": None}
        if signal_form is not None:
            # A double click sends one signal: the second is a duplicate of this key.
            signal_form["key"] = secrets.token_hex(16)
        done = request.query_params.get("done")
        return render(
            request, "run.html", status, caller=caller, token=token, run=run,
            timeline=timelines.timeline(run, history.checkpoints, retries,
                                        attempts=attempts, waits=waits),
            actions=actions, dag=dag_svg(run_json, checkpoints_json, forks),
            buttons=pages.allowed_actions(run, caller), show_state=show_state,
            merge_branches=[b["branch"] for f in open_forks for b in f["branches"]]
            if caller.may(required_role("merge")) else [],
            signal_form=signal_form, decision_key=secrets.token_hex(16),
            done=done if done in RUN_ACTIONS or done in SIGNAL_OUTCOMES else None)

    @app.get("/ui/runs/{workflow_id}", include_in_schema=False)
    async def run_page(request: Request, workflow_id: str) -> Response:
        async def build(caller: Caller, token: str | None) -> Response:
            return await run_view(request, caller, token, workflow_id)

        return await page(request, "viewer", build)

    # Before the generic /{action} route below, which would take "signal" for an action.
    @app.post("/ui/runs/{workflow_id}/signal", include_in_schema=False)
    async def signal_action(request: Request, workflow_id: str) -> Response:
        async def build(caller: Caller, token: str | None) -> Response:
            form = await checked_form(request, caller, token, required_role("signal"))
            name, text = form.get("name", "").strip(), form.get("payload", "")
            key = form.get("key") or None
            try:
                payload = signal_payload(text)
                # The API's own path (POST /v1/workflows/{id}/signals/{name}).
                scoped = await control.acting_as(caller.name).scoped(workflow_id)
                result = await scoped.signal(workflow_id, name, payload,
                                             "console:" + key if key else None)
            except Invalid as exc:
                return await run_view(request, caller, token, workflow_id, status=422,
                                      signal_form={"name": name, "payload": text,
                                                   "error": exc.reason})
            outcome = ("signal-duplicate" if result.duplicate else
                       "signal" if result.delivered else "signal-kept")
            return RedirectResponse(f"/ui/runs/{quote(workflow_id, safe='')}?done={outcome}",
                                    303)

        return await page(request, "viewer", build)


    @app.post("/ui/runs/{workflow_id}/{action}", include_in_schema=False)
    async def run_action(request: Request, workflow_id: str, action: str) -> Response:
        if action not in RUN_ACTIONS:
            return render(request, "error.html", 404, message=f"no action {action!r}",
                          title="404")
        role = required_role(action)

        async def build(caller: Caller, token: str | None) -> Response:
            form = await checked_form(request, caller, token, role)
            scoped = await control.acting_as(caller.name).scoped(workflow_id)
            reason = form.get("reason") or None
            if action == "merge":
                if not form.get("branch"):
                    raise Invalid("pick the branch to promote")
                await scoped.merge(workflow_id, form["branch"], reason)
            elif action in DECISIONS:
                # The page's key: a double click or a resubmitted form decides once.
                key = form.get("key") or None
                await getattr(scoped, action)(workflow_id, reason,
                                              idempotency_key="console:" + key if key else None)
            else:
                await getattr(scoped, action)(workflow_id, reason)
            return RedirectResponse(f"/ui/runs/{quote(workflow_id, safe='')}?done={action}",
                                    303)

        return await page(request, "viewer", build)

    # -- stalls, quarantine, fleet -------------------------------------------------------------

    @app.get("/ui/stalls", include_in_schema=False)
    async def stalls_page(request: Request) -> Response:
        params = request.query_params

        async def build(caller: Caller, token: str | None) -> Response:
            older_than = _float(params.get("older_than"), 600.0)
            before = _int(params.get("before"), 0, None) or None
            stalls, held = await asyncio.gather(
                control.views.stalls(older_than, 200),
                list_quarantine(control, before=before, limit=50))
            return render(request, "stalls.html", caller=caller, token=token,
                          stalls=stalls.stalls, older_than=older_than, quarantine=held,
                          may_redrive=caller.may(required_role("redrive")),
                          done=params.get("done") == "redrive")

        return await page(request, "viewer", build)

    @app.post("/ui/quarantine/{quarantine_id}/redrive", include_in_schema=False)
    async def redrive_action(request: Request,
                             quarantine_id: Annotated[int, Path(ge=1, le=2**63 - 1)]
                             ) -> Response:
        async def build(caller: Caller, token: str | None) -> Response:
            await checked_form(request, caller, token, required_role("redrive"))
            await redrive(control.acting_as(caller.name), quarantine_id)
            return RedirectResponse("/ui/stalls?done=redrive", 303)

        return await page(request, "viewer", build)

    @app.get("/ui/fleet", include_in_schema=False)
    async def fleet_page(request: Request) -> Response:
        from phasegate.orchestrator.api import queue_state

        async def build(caller: Caller, token: str | None) -> Response:
            fleet, queue, oldest, lag, held, workers, ages = await asyncio.gather(
                services.fleet.snapshot(), queue_state(services),
                control.views.oldest_unfinished_age_s(),
                control.pool.fetchval(queries()["outbox_lag"]),
                list_quarantine(control, limit=1), live_workers(control.pool),
                control.views.message_ages())
            return render(request, "fleet.html", caller=caller, token=token, fleet=fleet,
                          queue=queue, oldest_s=oldest, outbox_lag_s=float(lag),
                          quarantine_open=held.open, workers=workers, ages=ages)

        return await page(request, "viewer", build)

    @app.get("/ui/static/{name}", include_in_schema=False)
    async def static_file(name: str) -> Response:
        if name not in static:
            return Response("not found\n", 404, media_type="text/plain")
        return Response(static[name], media_type=STATIC_TYPES[name],
                        headers={"Cache-Control": "max-age=300",
                                 "X-Content-Type-Options": "nosniff"})


def _local(target: str) -> str:
    """Only a path on this server is a place to go after login (no open redirect)."""
    return target if target.startswith("/") and not target.startswith("//") \
        and "\\" not in target else "/"


def _int(value: str | None, default: int, allowed: tuple[int, ...] | None) -> int:
    try:
        number = int(value) if value else default
    except ValueError:
        raise Refused(422, f"not a number: {str(value)[:40]!r}") from None
    if allowed is not None and number not in allowed:
        return default
    if number < 0 or number > 2**63 - 1:
        raise Refused(422, "out of range")
    return number


def _float(value: str | None, default: float) -> float:
    try:
        number = float(value) if value else default
    except ValueError:
        raise Refused(422, f"not a number: {str(value)[:40]!r}") from None
    if not 0 <= number <= 10 * 365 * 86400:
        raise Refused(422, "older_than must be between 0 and ten years (seconds)")
    return number


def signal_payload(text: str) -> Any:
    """The signal form's payload: JSON text, or nothing at all for null."""
    if not text.strip():
        return None

    def not_json(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, parse_constant=not_json)
    except json.JSONDecodeError as exc:
        raise Invalid(f"the payload is not valid JSON: {exc.msg} (line {exc.lineno}, column "
                      f"{exc.colno})") from None
    except ValueError as exc:
        raise Invalid(f"the payload is not valid JSON: {exc}") from None
    except RecursionError:
        raise Invalid("the payload nests too deeply") from None
