"""Reference pages generated from the code at build time, so the docs cannot drift from it.

mkdocs loads this file as a hook (``hooks:`` in mkdocs.yml). A page asks for a generated block
with a marker line such as ``<!-- phasegate:settings -->``; :func:`on_page_markdown` replaces
it. Sources: the pydantic settings models (``phasegate.settings.Settings``,
``phasegate.worker.watchdog.WatchdogSettings``), the envelope model
(``phasegate.envelope.Envelope``), the FastAPI app (``phasegate.orchestrator.api.create_app``),
the click app (``phasegate.cli.main``) and the chart's ``values.yaml``.

Run as a script to rewrite the exported files ``docs/reference/envelope-v1.schema.json`` and
``docs/reference/openapi.json``; ``tests/unit/test_docs.py`` fails while they are stale::

    .venv/bin/python docs/hooks/reference.py
"""

# ruff: noqa: RUF001 - the page text uses typographic dashes and signs on purpose

from __future__ import annotations

import inspect
import json
import re
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
ENVELOPE_SCHEMA_FILE = REFERENCE / "envelope-v1.schema.json"
OPENAPI_FILE = REFERENCE / "openapi.json"
VALUES_FILE = ROOT / "charts" / "phasegate" / "values.yaml"
MARKER = re.compile(r"^<!-- phasegate:(?P<name>[a-z-]+) -->$", re.M)

# What a setting means, for fields whose model carries no ``description``. Kept here (not in
# the model) so the page reads like the old README table; the build fails when a field has
# neither a description nor a line here, or when a line names no field.
MEANINGS: dict[str, str] = {
    "database_url": "PostgreSQL DSN (`postgresql://…`); required by every command that "
                    "touches the database",
    "queue_url": "The SQS FIFO queue; required by workers, the relay and the orchestrator",
    "dlq_url": "The FIFO dead-letter queue (quarantine); required by workers",
    "sqs_endpoint_url": "moto / LocalStack endpoint; unset: AWS",
    "workflow_modules": "Comma-separated import paths of modules defining `Workflow`s; every "
                        "`Workflow` among a module's globals is loaded",
    "concurrency": "Phases one worker runs at once",
    "worker_id": "Recorded on checkpoints and lease holders; no `/`; default `hostname-pid`",
    "visibility_timeout_s": "Lease on a received message; keep it short (the heartbeat "
                            "extends it)",
    "heartbeat_s": "How often leases are extended; must be below the visibility timeout",
    "wait_time_s": "Long-poll wait (0–20)",
    "shutdown_grace_s": "On SIGTERM, how long running phases may finish",
    "max_message_bytes": "Larger messages are quarantined",
    "max_attempts": "Failed attempts of one phase before the run is `failed`",
    "retry_backoff_s": "Retry backoff base: a failed attempt's message comes back after a "
                       "random delay from 0 to `retry_backoff_s` × 2^(attempt−1) (full jitter)",
    "retry_backoff_max_s": "Retry backoff cap (the upper end of the jitter window)",
    "phase_timeout_s": "One attempt of a phase longer than this is cancelled and retried "
                       "(0 = no limit; `@wf.phase(name, timeout_s=...)` overrides)",
    "stale_after_s": "A run resuming from an older checkpoint re-checks its observed resources "
                     "([staleness envelope](../concepts/inside-a-phase.md#staleness-envelope))",
    "branch_max_depth": "How deep `ctx.fork` may nest (1: no fork inside a branch); a deeper fork "
                        "fails its phase with `ForkError` and writes nothing "
                        "([branches](../concepts/branches.md#nested-branches))",
    "branch_max_live": "Branches of one run live at once, at most; a fork that would pass it "
                       "fails its phase with `ForkError` and writes nothing",
    "db_pool_min": "Connections per worker, at least (keep small: pods × pool ≤ server)",
    "db_pool_max": "Connections per worker, at most",
    "db_connect_timeout_s": "One connection attempt",
    "startup_timeout_s": "How long a starting worker waits for Postgres and SQS",
    "relay_after_s": "The relay sends rows unsent this long after commit (database time)",
    "relay_interval_s": "Relay polling interval",
    "relay_batch": "Rows the relay sends per round",
    "relay_stall_after_s": "A run that has not moved this long although its message was sent "
                           "gets the message again under a new dedup id (a lost message never "
                           "strands work)",
    "relay_claim_ttl_s": "How long a relay's claim on the rows it is sending lasts; rows of a "
                         "relay that died mid-send go to another relay after this",
    "continuation": "Local continuation (`on`/`off`): after a commit the worker runs the next "
                    "phase itself with the state in memory, the successor row leased to it "
                    "([The phase transition](../concepts/transition.md#local-continuation))",
    "continuation_max_hops": "Phases one received message may continue locally before the "
                             "run is handed back to the queue",
    "continuation_max_s": "Seconds a local chain may run before the run is handed back to the "
                          "queue (checked between phases)",
    "leased_send": "Leased send (`on`/`off`): a plain successor that goes through SQS is "
                   "committed as a short lease on the run's position instead of an outbox "
                   "row, and the worker sends it "
                   "([The phase transition](../concepts/transition.md#leased-send))",
    "metrics_host": "Worker `/metrics`, `/healthz`, `/readyz`: listen address",
    "metrics_port": "Worker `/metrics`, `/healthz`, `/readyz`: port",
    "log_level": "Log level (for the standard-library loggers too; the AWS SDK, httpx and "
                 "kubernetes loggers never below WARNING)",
    "log_format": "`auto` = JSON unless stderr is a TTY",
    "api_host": "Orchestrator API listen address (`--host`)",
    "api_port": "Orchestrator API port (`--port`)",
    "faults": "**TEST ONLY** — SIGKILL at named points (`phasegate/faults.py`); never set in "
              "production",
    "fault_seed": "**TEST ONLY** — seed for `PHASEGATE_FAULTS`",
    # WatchdogSettings
    "enabled": "Run the watchdog at all",
    "psi_window_us": "Trigger window, 0.5–10 s; multiples of 2 s without CAP_SYS_RESOURCE",
    "release_headroom_ratio": "Release only below this ratio …",
}


def settings_models() -> list[tuple[str, type[Any], str]]:
    from phasegate.settings import ENV_PREFIX, Settings
    from phasegate.worker.watchdog import WatchdogSettings

    return [("Settings", Settings, ENV_PREFIX),
            ("WatchdogSettings", WatchdogSettings, "PHASEGATE_WATCHDOG_")]


def _type_name(annotation: Any) -> str:
    """``int``, ``str or None``, ``one of debug, info``: words, since a table cell cannot hold
    a bare ``|``."""
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(str(v) for v in get_args(annotation))
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    args = get_args(annotation)
    if args:
        return " or ".join(_type_name(a) for a in args)
    return str(annotation).replace("typing.", "")


def _default(field: Any) -> str:
    if field.default_factory is not None:
        return "computed"
    if field.default is None:
        return "unset"
    if isinstance(field.default, bool):
        return f"`{str(field.default).lower()}`"
    if field.default == "":
        return '`""`'
    return f"`{field.default}`"


def _bounds(field: Any) -> str:
    symbols = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    out = []
    for item in field.metadata:
        for attr, symbol in symbols.items():
            value = getattr(item, attr, None)
            if value is not None:
                out.append(f"{symbol} {value}")
        pattern = getattr(item, "pattern", None)
        if pattern:
            out.append(f"`{pattern}`")
    return ", ".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_table(model: type[Any], prefix: str) -> str:
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        meaning = field.description or MEANINGS.get(name)
        if not meaning:
            raise ValueError(f"setting {prefix}{name.upper()} has no description: add one to "
                             "the model or to MEANINGS in docs/hooks/reference.py")
        kind = ", ".join(filter(None, [_type_name(field.annotation), _bounds(field)]))
        rows.append(f"| `{prefix}{name.upper()}` | {_cell(kind)} | {_default(field)} | "
                    f"{_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def settings_markdown() -> str:
    models = settings_models()
    known = {name for _, model, _ in models for name in model.model_fields}
    unknown = sorted(set(MEANINGS) - known)
    if unknown:
        raise ValueError(f"MEANINGS names settings that no longer exist: {unknown}")
    (_, settings, prefix), (_, watchdog, watchdog_prefix) = models
    return (settings_table(settings, prefix) + "\n## Watchdog settings\n\n"
            "Class `WatchdogSettings` (`worker/watchdog.py`), prefix `PHASEGATE_WATCHDOG_`; see "
            "[the watchdog](../concepts/watchdog.md).\n\n"
            + settings_table(watchdog, watchdog_prefix))


def envelope_schema() -> dict[str, Any]:
    from phasegate.envelope import Envelope

    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://phasegate.dev/schemas/envelope-v1.schema.json",
        **Envelope.model_json_schema(mode="validation"),
    }
    schema["title"] = "phasegate message envelope v1"
    return schema


def openapi_document() -> dict[str, Any]:
    from phasegate.orchestrator.api import create_app

    # The document depends only on the routes; the services are used when a request is served.
    services = types.SimpleNamespace(control=None, queue=None, fleet=None, auth=None,
                                     max_body_bytes=0)
    return create_app(services).openapi()  # type: ignore[arg-type]


def dump(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def exported_files() -> dict[Path, str]:
    return {ENVELOPE_SCHEMA_FILE: dump(envelope_schema()), OPENAPI_FILE: dump(openapi_document())}


def envelope_markdown() -> str:
    return "```json\n" + dump(envelope_schema()) + "```\n"


def _responses(operation: dict[str, Any]) -> str:
    return ", ".join(sorted(operation.get("responses", {})))


def _body_schema(operation: dict[str, Any]) -> str:
    schema = (operation.get("requestBody", {}).get("content", {})
              .get("application/json", {}).get("schema", {}))
    refs = [s.get("$ref", "") for s in [schema, *schema.get("anyOf", [])]]
    names = [ref.rsplit("/", 1)[-1] for ref in refs if ref]
    optional = not operation.get("requestBody", {}).get("required", False)
    return f"body{' (optional)' if optional else ''}: `{names[0]}`" if names else ""


def _parameters(operation: dict[str, Any]) -> str:
    names = [f"`{p['name']}` ({p['in']})" for p in operation.get("parameters", [])]
    body = _body_schema(operation)
    return ", ".join([*names, body] if body else names)


def openapi_markdown() -> str:
    document = openapi_document()
    rows = ["| method and path | summary | parameters | responses |", "|---|---|---|---|"]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            rows.append(f"| `{method.upper()} {path}` | {_cell(operation.get('summary', ''))} | "
                        f"{_cell(_parameters(operation))} | {_responses(operation)} |")
    out = ["\n".join(rows), "", "## Schemas", ""]
    for name, schema in sorted(document.get("components", {}).get("schemas", {}).items()):
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [_cell(schema["description"]), ""]
        out += ["| field | type | required | description |", "|---|---|---|---|"]
        required = set(schema.get("required", []))
        for field, spec in schema.get("properties", {}).items():
            out.append(f"| `{field}` | {_cell(_schema_type(spec))} | "
                       f"{'yes' if field in required else ''} | "
                       f"{_cell(spec.get('description', ''))} |")
        out.append("")
    return "\n".join(out)


def _schema_type(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        return f"`{spec['$ref'].rsplit('/', 1)[-1]}`"
    if "anyOf" in spec:
        return " or ".join(_schema_type(s) for s in spec["anyOf"])
    if "enum" in spec:
        return " \\| ".join(f"`{v}`" for v in spec["enum"])
    if spec.get("type") == "array":
        return f"list of {_schema_type(spec.get('items', {}))}"
    return f"`{spec.get('type', 'any')}`"


def _walk(command: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    yield path, command
    for name in sorted(getattr(command, "commands", {})):
        yield from _walk(command.commands[name], [*path, name])


def _shown_default(param: Any) -> str:
    import click

    default = param.default
    unset = getattr(click.core, "UNSET", None)  # click >= 8.3 marks "no default" with a sentinel
    if default is None or default is False or default is unset or callable(default):
        return ""
    return f"`{default}`"


def _option_row(param: Any) -> str:
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    envvar = f"`{param.envvar}`" if isinstance(param.envvar, str) else ""
    kind = "flag" if getattr(param, "is_flag", False) else param.type.name
    return (f"| {names} | {_cell(kind)} | {envvar} | {_shown_default(param)} | "
            f"{_cell(getattr(param, 'help', None) or '')} |")


def cli_markdown() -> str:
    import click

    from phasegate.cli import main

    out: list[str] = []
    for path, command in _walk(main, ["phasegate"]):
        if len(path) == 1:
            continue
        arguments = " ".join(p.human_readable_name for p in command.params
                             if isinstance(p, click.Argument))
        out.append(f"## `{' '.join(path)}`\n")
        out.append(f"```text\n{' '.join(path)} [OPTIONS] {arguments}".rstrip() + "\n```\n")
        if command.help:
            out.append(inspect.cleandoc(command.help) + "\n")
        options = [p for p in command.params if isinstance(p, click.Option)]
        if options:
            out.append("| option | type | env var | default | help |\n|---|---|---|---|---|")
            out.extend(_option_row(p) for p in options)
            out.append("")
    return "\n".join(out)


_PARAM = re.compile(r"^\s*## @(?P<tag>param|extra) (?P<key>\S+)(?: \[[^\]]*\])? (?P<text>.*)$")


def _lookup(values: Any, dotted: str) -> Any:
    """``values`` at a dotted key; label maps may have dots in their own keys, so the longest
    remaining key that exists wins."""
    parts = dotted.split(".")
    node = values
    while parts:
        for size in range(len(parts), 0, -1):
            candidate = ".".join(parts[:size])
            if isinstance(node, dict) and candidate in node:
                node, parts = node[candidate], parts[size:]
                break
        else:
            raise KeyError(dotted)
    return node


def _values_entries() -> Iterator[tuple[str, str, str]]:
    """(dotted key, default, description) for every ``## @param``/``@extra`` in values.yaml
    (the readme-generator-for-helm metadata the chart README is generated from)."""
    text = VALUES_FILE.read_text()
    values = yaml.safe_load(text)
    for line in text.splitlines():
        match = _PARAM.match(line)
        if not match:
            continue
        value = _lookup(values, match["key"])
        if isinstance(value, dict) and value:
            default = ""
        else:
            default = yaml.safe_dump(value, default_flow_style=True).strip()
            default = default.removesuffix("...").strip()
        yield match["key"], default, match["text"].strip()


def chart_values_markdown() -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for key, value, comment in _values_entries():
        default = f"`{_cell(value)}`" if value else "(a map)"
        rows.append(f"| `{key}` | {default} | {_cell(comment)} |")
    return "\n".join(rows) + "\n"


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_markdown,
    "envelope-schema": envelope_markdown,
    "openapi": openapi_markdown,
    "cli": cli_markdown,
    "chart-values": chart_values_markdown,
}


def render(markdown: str) -> str:
    """Replace every marker line with its generated block; an unknown marker is an error."""
    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in GENERATORS:
            raise ValueError(f"unknown docs marker phasegate:{name}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return render(markdown)


def write_exports() -> None:
    for path, text in exported_files().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write_exports()
