"""Generated requests (schemathesis, from the served OpenAPI document) against the real
orchestrator process: valid and invalid input, with an admin token and with none, never
produce a 500, and every answer is one the document declares or a gate refusal."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from phasegate.orchestrator.embedded import free_port
from phasegate.settings import Settings
from tests.helpers import settings_env, wait_for, write_tokens
from tests.integration.test_api_auth import spawn

# 400: a body that is not even text (FastAPI cannot decode it to parse it as JSON).
GATE = {400, 401, 403, 413, 422, 503}


def test_no_generated_request_is_a_server_error(settings: Settings, tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens", {"ada": "admin"})
    port = free_port()
    process = spawn(port, tmp_path / "orchestrator.log", {
        **settings_env(settings), "PHASEGATE_API_AUTH": "tokens",
        "PHASEGATE_API_TOKENS_FILE": str(tmp_path / "tokens")})
    url = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        assert process.poll() is None, (tmp_path / "orchestrator.log").read_text()[-2000:]
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"{url}/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    try:
        asyncio.run(wait_for(ready, timeout=60, what="orchestrator ready"))
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 18
        checked: list[tuple[str, int]] = []
        for operation in operations:
            check(operation, tokens["ada"], checked)
        assert {code for _, code in checked} >= {200, 401, 422}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def check(operation: schemathesis.APIOperation, token: str,
          checked: list[tuple[str, int]]) -> None:
    """Generated cases of one operation, with and without the admin token."""
    cases = st.one_of(operation.as_strategy(),
                      operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE))

    @hypothesis_settings(max_examples=20, deadline=None, database=None,
                         suppress_health_check=list(HealthCheck))
    @given(case=cases, authorised=st.booleans())
    def call(case: schemathesis.Case, authorised: bool) -> None:
        headers = {"Authorization": f"Bearer {token}"} if authorised else {}
        response = case.call(headers=headers, timeout=10)
        checked.append((operation.label, response.status_code))
        assert response.status_code < 500, (case.as_curl_command(), response.text)
        declared = {int(code) for code in operation.definition.raw["responses"]
                    if code.isdigit()}
        assert response.status_code in declared | GATE | {200, 201, 404, 405}, (
            case.as_curl_command(), response.status_code)
        if not authorised and operation.path.startswith("/v1"):
            assert response.status_code == 401

    call()
