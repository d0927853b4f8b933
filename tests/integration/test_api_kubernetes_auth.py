"""``PHASEGATE_API_AUTH=kubernetes``: ServiceAccount tokens checked with a TokenReview by the
real ``kubernetes`` client, against a local stand-in of the Kubernetes API over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from phasegate.access import parse_service_accounts
from phasegate.orchestrator.api import Services, create_app
from phasegate.orchestrator.auth import KubernetesAuth
from phasegate.orchestrator.control import Control
from phasegate.orchestrator.fleet import FleetView
from phasegate.store import create_pool
from phasegate.workflow import Registry
from tests.helpers import bearer
from tests.json_server import JsonServer

REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
# Token -> the user the apiserver says it belongs to (None: not authenticated).
USERS = {"ci-token": "system:serviceaccount:jobs:ci",
         "dash-token": "system:serviceaccount:jobs:dash",
         "stray-token": "system:serviceaccount:other:ci",
         "alice-token": "alice@example.com"}
ACCOUNTS = parse_service_accounts('{"jobs:ci": ["operator"], "jobs:dash": ["viewer"]}')


class FakeTokenReviewer(JsonServer):
    def __init__(self) -> None:
        self.reviews: list[tuple[str, str | None]] = []
        super().__init__(lambda path, headers: (404, {"kind": "Status", "code": 404}),
                         post=self.review)

    def review(self, path: str, headers: Any, body: Any) -> tuple[int, dict[str, Any]]:
        if path != REVIEWS:
            return 404, {"kind": "Status", "code": 404}
        token = body["spec"]["token"]
        self.reviews.append((token, headers.get("Authorization")))
        user = USERS.get(token)
        status: dict[str, Any] = {"authenticated": user is not None}
        if user is not None:
            status["user"] = {"username": user, "groups": ["system:serviceaccounts"]}
        return 201, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                     "spec": body["spec"], "status": status}


@pytest.fixture
async def setup(database_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, FakeTokenReviewer,
                                                          KubernetesAuth]]:
    pool = await create_pool(database_url, min_size=1, max_size=2)
    with FakeTokenReviewer() as apiserver:
        auth = KubernetesAuth.for_host(apiserver.url, ACCOUNTS, token="orchestrator-sa")
        app = create_app(Services(control=Control(pool, None, Registry()), queue=None,
                                  fleet=FleetView(None, reason="none"), auth=auth))
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://api") as client:
                yield client, apiserver, auth
        finally:
            auth.close()
            await pool.close()


async def test_service_accounts_map_to_roles(setup: Any) -> None:
    client, apiserver, _ = setup
    cancel = "/v1/workflows/nope/cancel"
    assert (await client.get("/v1/summary")).status_code == 401
    assert (await client.get("/v1/summary", headers=bearer("forged"))).status_code == 401
    assert (await client.get("/v1/summary", headers=bearer("dash-token"))).status_code == 200
    assert (await client.post(cancel, headers=bearer("dash-token"))).status_code == 403
    # The operator account gets past the gate (the run does not exist: 404).
    assert (await client.post(cancel, headers=bearer("ci-token"))).status_code == 404
    merge = await client.post("/v1/workflows/nope/merge", json={"branch": "b"},
                              headers=bearer("ci-token"))
    assert merge.status_code == 403 and "admin" in merge.json()["detail"]
    # Authenticated but not mapped (another namespace, a person): no roles, 403.
    assert (await client.get("/v1/summary", headers=bearer("stray-token"))).status_code == 403
    assert (await client.get("/v1/summary", headers=bearer("alice-token"))).status_code == 403
    # The orchestrator called with its own credentials; answers are cached per token.
    assert {auth for _, auth in apiserver.reviews} == {"Bearer orchestrator-sa"}
    assert sorted({token for token, _ in apiserver.reviews}) == sorted(
        ["forged", "dash-token", "ci-token", "stray-token", "alice-token"])
    assert len(apiserver.reviews) == 5


async def test_apiserver_unreachable_is_503(setup: Any) -> None:
    client, apiserver, _ = setup
    apiserver.server.shutdown()
    apiserver.server.server_close()
    response = await client.get("/v1/summary", headers=bearer("ci-token"))
    assert response.status_code == 503 and "Kubernetes" in response.json()["detail"]
