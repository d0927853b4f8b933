"""A fake external API for examples and tests: tickets to read, replies and reports to write.

It behaves like a well-made real one: writes REQUIRE an ``Idempotency-Key`` header, and a key
seen before returns the original response instead of acting twice. It counts every call by
key, so a test can assert "called twice with one key, exactly one effect". It runs as a real
HTTP server on 127.0.0.1 in a thread, so worker subprocesses can call it too::

    with FakeApi() as api:            # api.url -> "http://127.0.0.1:PORT"
        ...
        api.stats()                   # calls by key, effects, reads, version checks

Endpoints: ``GET /tickets/{id}``, ``GET /tickets/{id}/version``, ``POST /replies``,
``POST /reports`` (both need ``Idempotency-Key``); test controls ``POST /tickets/{id}/bump``
(an outside change) and ``POST /tickets/{id}/break`` (its version endpoint fails).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class FakeApi:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.lock = threading.Lock()
        self.versions: dict[str, int] = {}
        self.broken: set[str] = set()
        self.reads: Counter[str] = Counter()
        self.version_checks: Counter[str] = Counter()
        self.calls_by_key: Counter[str] = Counter()
        self.responses: dict[str, dict[str, Any]] = {}
        self.effects: list[dict[str, Any]] = []
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"reads": dict(self.reads), "version_checks": dict(self.version_checks),
                    "calls_by_key": dict(self.calls_by_key),
                    "effects": [dict(e) for e in self.effects]}

    # -- behaviour ------------------------------------------------------------------------

    def ticket(self, ticket_id: str) -> dict[str, Any]:
        version = self.versions.setdefault(ticket_id, 1)
        return {"id": ticket_id, "version": f"v{version}",
                "subject": f"Printer on floor {len(ticket_id)} is on fire",
                "customer": "acme"}

    def write(self, kind: str, key: str | None, body: Any) -> tuple[int, dict[str, Any]]:
        if not key:
            return 400, {"error": "Idempotency-Key header is required for writes"}
        self.calls_by_key[key] += 1
        if key in self.responses:
            return 200, {**self.responses[key], "replayed": True}
        response = {"id": f"{kind}-{len(self.effects) + 1}", "kind": kind, "accepted": True}
        self.effects.append({"kind": kind, "key": key, "body": body, "id": response["id"]})
        self.responses[key] = response
        return 201, response

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                with api.lock:
                    if len(parts) == 2 and parts[0] == "tickets":
                        api.reads[parts[1]] += 1
                        return self._reply(200, api.ticket(parts[1]))
                    if len(parts) == 3 and parts[0] == "tickets" and parts[2] == "version":
                        api.version_checks[parts[1]] += 1
                        if parts[1] in api.broken:
                            return self._reply(503, {"error": "version service unavailable"})
                        return self._reply(200, {"version": api.ticket(parts[1])["version"]})
                    if parts == ["_stats"]:
                        return self._reply(200, api.stats())
                return self._reply(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"null"
                parts = self.path.strip("/").split("/")
                with api.lock:
                    if len(parts) == 1 and parts[0] in ("replies", "reports"):
                        kind = {"replies": "reply", "reports": "report"}[parts[0]]
                        status, body = api.write(kind, self.headers.get("Idempotency-Key"),
                                                 json.loads(raw))
                        return self._reply(status, body)
                    if len(parts) == 3 and parts[0] == "tickets" and parts[2] == "bump":
                        api.versions[parts[1]] = api.versions.get(parts[1], 1) + 1
                        return self._reply(200, api.ticket(parts[1]))
                    if len(parts) == 3 and parts[0] == "tickets" and parts[2] == "break":
                        api.broken.add(parts[1])
                        return self._reply(200, {"broken": parts[1]})
                return self._reply(404, {"error": "not found"})

        return Handler


class ApiClient:
    """What a workflow uses to talk to the (fake) external API."""

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    async def _request(self, method: str, path: str, body: Any = None,
                       key: str | None = None) -> Any:
        headers = {"Idempotency-Key": key} if key else {}
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            response = await client.request(method, self.base_url + path, json=body,
                                            headers=headers)
        response.raise_for_status()
        return response.json()

    async def get_ticket(self, ticket_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("GET", f"/tickets/{ticket_id}")
        return result

    async def ticket_version(self, ticket_id: str) -> str:
        return str((await self._request("GET", f"/tickets/{ticket_id}/version"))["version"])

    async def post_reply(self, ticket_id: str, text: str, *,
                         idempotency_key: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request(
            "POST", "/replies", {"ticket_id": ticket_id, "text": text}, idempotency_key)
        return result

    async def send_report(self, report: dict[str, Any], *,
                          idempotency_key: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("POST", "/reports", report,
                                                     idempotency_key)
        return result

    async def bump(self, ticket_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("POST", f"/tickets/{ticket_id}/bump")
        return result

    async def break_versions(self, ticket_id: str) -> None:
        await self._request("POST", f"/tickets/{ticket_id}/break")


def main() -> None:
    """``python -m phasegate.worker.examples.fake_api [PORT]``: serve the fake API until Ctrl-C."""
    import sys
    import time

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
    with FakeApi(port=port) as api:
        print(f"fake API on {api.url}", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
