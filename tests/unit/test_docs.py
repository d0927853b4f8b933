"""The documentation is checked like code: every ``python`` snippet of README.md and docs/
runs, every ``py`` snippet (a signature) compiles, and the exported contracts
(docs/reference/envelope-v1.schema.json, docs/reference/openapi.json) match the code."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import jsonschema
import pytest

from phasegate.envelope import Envelope, start_message

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# A fence opens with ```python or ```py (optionally indented, optionally with attributes such
# as title="..."); its closing fence has the same indentation.
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>python|py)\b[^\n]*\n(?P<code>.*?)^(?P=indent)```",
    re.S | re.M)
SNIPPET = re.compile(r'^--8<-- "(?P<path>[^"]+)"$', re.M)


def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference",
                                                  ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dedent(code: str, indent: str) -> str:
    return "".join(line.removeprefix(indent) for line in code.splitlines(keepends=True))


def snippets() -> list[tuple[str, str, str]]:
    """(id, language, code) for every python/py block, with ``--8<--`` includes resolved."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            code = SNIPPET.sub(lambda m: (ROOT / m["path"]).read_text(),
                               dedent(match["code"], match["indent"]))
            line = text.count("\n", 0, match.start()) + 1
            out.append((f"{page.relative_to(ROOT)}:{line}", match["lang"], code))
    return out


SNIPPETS = snippets()


def test_the_docs_have_snippets_to_run():
    languages = [lang for _, lang, _ in SNIPPETS]
    assert languages.count("python") >= 8 and "py" in languages


@pytest.mark.parametrize(("where", "language", "code"), SNIPPETS, ids=[s[0] for s in SNIPPETS])
def test_snippet(where: str, language: str, code: str):
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    compiled = compile(code, where, "exec", flags=flags, dont_inherit=True)
    if language == "py":
        return  # a signature: it must parse, it is not meant to run
    namespace: dict[str, object] = {"__name__": f"docs_snippet_{abs(hash(where))}"}
    result = eval(compiled, namespace)  # the snippet is ours, and it must run
    if asyncio.iscoroutine(result):
        asyncio.run(result)


def test_exported_files_are_current():
    hook = load_hook()
    for path, text in hook.exported_files().items():
        fix = "run .venv/bin/python docs/hooks/reference.py"
        assert path.exists(), f"{path.name} is missing: {fix}"
        assert path.read_text() == text, f"{path.name} is stale: {fix}"


def test_the_exported_envelope_schema_accepts_what_workers_send_and_rejects_typos():
    schema = json.loads((ROOT / "docs" / "reference" / "envelope-v1.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    message = json.loads(start_message("wf_1", "document-pipeline", {"pages": 3}).to_json())
    jsonschema.validate(message, schema)
    Envelope.model_validate(message)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**message, "workflw": "typo"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**message, "v": 2}, schema)


def test_every_setting_has_a_meaning_and_every_marker_renders():
    hook = load_hook()
    page = hook.render("<!-- phasegate:settings -->\n<!-- phasegate:cli -->\n"
                       "<!-- phasegate:openapi -->\n<!-- phasegate:chart-values -->\n")
    for expected in ("`PHASEGATE_DATABASE_URL`", "`PHASEGATE_WATCHDOG_HEADROOM_RATIO`",
                     "## `phasegate worker`", "`PHASEGATE_API_URL`",
                     "`POST /v1/workflows`", "`autoscaling.mode`"):
        assert expected in page
    with pytest.raises(ValueError, match="unknown docs marker"):
        hook.render("<!-- phasegate:nothing -->\n")
