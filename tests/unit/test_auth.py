"""Tokens file parsing and lookup, roles, the refusal of an open API off loopback, and
``phasegate token new``."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from phasegate.access import parse_service_accounts
from phasegate.cli import main
from phasegate.orchestrator.auth import (
    Caller,
    KubernetesAuth,
    NoAuth,
    TokenFile,
    authenticator_from,
    is_loopback,
    parse_tokens,
    token_digest,
    token_line,
)
from phasegate.settings import SettingsError, load_settings

HEX = "a" * 64


def test_roles_nest_and_unknown_roles_grant_nothing() -> None:
    assert Caller("v", frozenset({"viewer"})).may("viewer")
    assert not Caller("v", frozenset({"viewer", "analyst"})).may("operator")
    assert Caller("o", frozenset({"operator"})).may("viewer")
    assert not Caller("o", frozenset({"operator"})).may("admin")
    assert Caller("a", frozenset({"admin"})).may("operator")
    assert not Caller("x", frozenset({"analyst"})).may("viewer")
    assert not Caller("x", frozenset()).may("viewer")


@pytest.mark.parametrize(("text", "problem"), [
    ("ada admin", "line 1: expected"),
    (f"ada admin {HEX} extra", "line 1: expected"),
    ("ada admin XYZ", "sha256"),
    (f"ada admin {HEX.upper()}", "sha256"),
    (f"a/b admin {HEX}", "name"),
    (f"ada ad min,x {HEX}", "expected"),
    (f"ada admin,b@d {HEX}", "roles"),
    (f"ada admin {HEX}\n# c\n\nada viewer {'b' * 64}", "line 4: the name 'ada' is used twice"),
    (f"ada admin {HEX}\nbob viewer {HEX}", "line 2: the same token"),
])
def test_a_bad_tokens_file_names_the_line_never_the_digest(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as raised:
        parse_tokens(text)
    assert HEX not in str(raised.value)


def test_lookup_by_digest_and_reload_on_change(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("# who may call\n" + token_line("ada", ["admin"], "secret-1") + "\n")
    tokens = TokenFile(path)
    assert "secret-1" not in path.read_text() and token_digest("secret-1") in path.read_text()
    assert tokens.lookup("secret-1") == Caller("ada", frozenset({"admin"}))
    assert tokens.lookup("secret-2") is None and tokens.lookup("") is None
    path.write_text(token_line("bob", ["viewer", "analyst"], "secret-2") + "\n")
    assert tokens.lookup("secret-1") is None
    assert tokens.lookup("secret-2") == Caller("bob", frozenset({"viewer", "analyst"}))
    path.write_text("garbage\n")  # broken: the last good file stays in force
    assert tokens.lookup("secret-2") is not None
    path.unlink()
    assert tokens.lookup("secret-2") is not None


def test_a_missing_or_bad_file_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing"):
        TokenFile(tmp_path / "missing")
    (tmp_path / "bad").write_text("nope\n")
    with pytest.raises(ValueError, match="line 1"):
        TokenFile(tmp_path / "bad")


def test_open_api_only_on_loopback_and_tokens_need_a_file() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert isinstance(authenticator_from(mode="none", tokens_file=None, service_accounts=None,
                                         host="127.0.0.1"), NoAuth)
    with pytest.raises(ValueError, match="loopback"):
        authenticator_from(mode="none", tokens_file=None, service_accounts=None, host="0.0.0.0")
    with pytest.raises(ValueError, match="PHASEGATE_API_TOKENS_FILE"):
        authenticator_from(mode="tokens", tokens_file=None, service_accounts=None,
                           host="127.0.0.1")


def test_auth_settings() -> None:
    assert load_settings().api_auth == "tokens"  # on by default
    assert load_settings(api_auth="NONE").api_auth == "none"
    assert load_settings().api_max_body_bytes == 262_144
    with pytest.raises(SettingsError, match="PHASEGATE_API_AUTH"):
        load_settings(api_auth="open")
    with pytest.raises(SettingsError, match="PHASEGATE_API_SERVICE_ACCOUNTS"):
        load_settings(api_service_accounts='{"ci": ["admin"]}')
    with pytest.raises(SettingsError, match="PHASEGATE_API_MAX_BODY_BYTES"):
        load_settings(api_max_body_bytes=10)


def test_service_account_mapping() -> None:
    accounts = parse_service_accounts('{"jobs:ci": ["operator", "ops"]}')
    assert accounts == {"jobs:ci": frozenset({"operator", "ops"})}
    for bad in ("[]", '{"ci": ["admin"]}', '{"a:b": []}', '{"a:b": ["bad role"]}', "x"):
        with pytest.raises(ValueError):
            parse_service_accounts(bad)
    auth = KubernetesAuth(None, accounts)
    assert auth._caller("system:serviceaccount:jobs:ci") == Caller(
        "jobs:ci", frozenset({"operator", "ops"}))
    assert auth._caller("system:serviceaccount:jobs:other").roles == frozenset()
    assert auth._caller("alice").roles == frozenset()
    assert auth._caller(None) is None


def test_token_new_prints_a_token_and_its_line() -> None:
    result = CliRunner().invoke(main, ["token", "new", "ci-bot", "--role", "operator",
                                       "--role", "ops"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    token = lines[0].removeprefix("token: ")
    name, roles, digest = lines[-1].split()
    assert (name, roles) == ("ci-bot", "operator,ops")
    assert digest == hashlib.sha256(token.encode()).hexdigest() and len(token) > 40
    assert parse_tokens(lines[-1])[0].name == "ci-bot"
    again = CliRunner().invoke(main, ["token", "new", "ci-bot", "--role", "operator"])
    assert again.stdout.splitlines()[0] != lines[0]  # random every time
    for args in (["bad name", "--role", "admin"], ["x", "--role", "analyst"], ["x"]):
        refused = CliRunner().invoke(main, ["token", "new", *args])
        assert refused.exit_code == 2



def test_every_v1_route_has_a_role_decided() -> None:
    """A new /v1 route must be added to ROUTE_ROLES (else it needs admin by default)."""
    import types

    from fastapi.routing import APIRoute

    from phasegate.orchestrator.api import create_app
    from phasegate.orchestrator.gate import OPEN_PATHS, ROUTE_ROLES, is_console_path

    app = create_app(types.SimpleNamespace(control=None, queue=None, fleet=None,
                                           auth=NoAuth(), max_body_bytes=1024))
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    v1 = {r.name for r in routes if r.path.startswith("/v1")}
    assert v1 == set(ROUTE_ROLES)
    # The console's pages check their own cookie with the same roles (test_console.py).
    assert {r.path for r in routes if not r.path.startswith("/v1")
            and not is_console_path(r.path)} <= OPEN_PATHS
    spec = app.openapi()
    for path, methods in spec["paths"].items():
        for operation in methods.values():
            if path.startswith("/v1"):
                assert operation["security"] == [{"bearer": []}]
                assert {"401", "403"} <= set(operation["responses"])
                assert "role" in operation["description"]
            else:
                assert "security" not in operation
