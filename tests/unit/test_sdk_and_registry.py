from __future__ import annotations

import types

import pytest

from phasegate import Context, Registry, Workflow, WorkflowDefinitionError
from phasegate.sql import migration_files, parse_queries, queries


def make() -> Workflow:
    wf = Workflow("demo-flow", schema_version=2)

    @wf.phase("one")
    async def one(ctx: Context, state: dict) -> dict:
        return state

    @wf.phase("two")
    async def two(ctx: Context, state: dict) -> dict:
        return state

    return wf


def test_phases_run_in_declaration_order():
    wf = make()
    assert [p.name for p in wf.phases] == ["one", "two"]
    assert wf.first_phase == "one" and wf.next_phase("one") == "two"
    assert wf.next_phase("two") is None


def test_next_phase_sees_a_phase_declared_after_it_was_first_asked():
    wf = make()
    assert wf.next_phase("two") is None

    @wf.phase("three")
    async def three(ctx: Context, state: dict) -> dict:
        return state

    assert [wf.next_phase(name) for name in ("one", "two", "three")] == ["two", "three", None]


def test_definition_errors_are_clear():
    wf = make()
    with pytest.raises(WorkflowDefinitionError, match="declared twice"):
        wf.phase("one")
    with pytest.raises(WorkflowDefinitionError, match="async"):
        wf.phase("three")(lambda ctx, state: state)  # type: ignore[arg-type]
    with pytest.raises(WorkflowDefinitionError, match="name"):
        Workflow("has spaces")
    with pytest.raises(WorkflowDefinitionError, match="no phases"):
        Registry([Workflow("empty")])


def test_registry_collects_workflows_from_modules_and_refuses_name_clashes():
    module = types.ModuleType("user_flows")
    module.a = make()  # type: ignore[attr-defined]
    registry = Registry()
    registry.add_module(module)
    assert registry.names() == ["demo-flow"]
    with pytest.raises(WorkflowDefinitionError, match="two workflows"):
        registry.add(make())
    with pytest.raises(ImportError, match="cannot import 'no_such_mod'"):
        Registry.from_modules(["no_such_mod"])


def test_progress_is_copied_so_later_mutation_does_not_leak():
    ctx = Context(workflow_id="w", workflow="f", phase="p", seq=0, branch="main", attempt=1,
                  worker_id="x", schema_version=1)
    state = {"done": [1]}
    ctx.progress(state)
    state["done"].append(2)
    assert ctx.latest_progress == (1, {"done": [1]})


def test_named_queries_parse_and_duplicates_are_refused():
    assert "commit_phase" in queries() and "claim_unsent" in queries()
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_migrations_are_numbered_in_order():
    versions = [v for v, _, _ in migration_files()]
    assert versions == sorted(versions) and versions[0] == 1
