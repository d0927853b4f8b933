"""values.yaml is the chart's documentation: every key the schema declares has a comment
directly above it, and the schema is strict everywhere (additionalProperties: false)."""

from __future__ import annotations

import json
import re

from tests.deploy import chart

VALUES = (chart.CHART_DIR / "values.yaml").read_text().splitlines()
SCHEMA = json.loads((chart.CHART_DIR / "values.schema.json").read_text())
KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w.-]*):")


def declared(path: list[str]) -> bool:
    node = SCHEMA
    for key in path:
        properties = node.get("properties", {})
        if key not in properties:
            return False
        node = properties[key]
    return True


def keys_with_comments() -> list[tuple[str, bool]]:
    stack: list[tuple[int, str]] = []
    out = []
    for i, line in enumerate(VALUES):
        match = KEY.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k in stack] + [match["key"]]
        stack.append((indent, match["key"]))
        if not declared(path) or "resources" in path[:-1]:
            continue  # inside a free-form map (resources, labels, ...)
        above = next((VALUES[j].strip() for j in range(i - 1, -1, -1) if VALUES[j].strip()), "")
        out.append((".".join(path), above.startswith("#")))
    return out


def test_every_declared_key_has_a_comment():
    found = keys_with_comments()
    assert len(found) > 80
    assert [path for path, commented in found if not commented] == []


def test_every_schema_object_is_closed():
    def walk(node: dict, path: str) -> list[str]:
        open_objects = []
        if node.get("type") == "object" and "properties" in node:
            if node.get("additionalProperties") is not False:
                open_objects.append(path or "<root>")
            for key, child in node["properties"].items():
                open_objects += walk(child, f"{path}.{key}")
        return open_objects

    assert walk(SCHEMA, "") == []


def test_every_default_value_is_declared_in_the_schema():
    values = chart.load_values(chart.CHART_DIR / "values.yaml")

    def walk(value: object, node: dict, path: str) -> list[str]:
        missing = []
        if isinstance(value, dict) and "properties" in node:
            for key, child in value.items():
                if key not in node["properties"]:
                    missing.append(f"{path}.{key}")
                else:
                    missing += walk(child, node["properties"][key], f"{path}.{key}")
        return missing

    assert walk(values, SCHEMA, "") == []
