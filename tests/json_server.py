"""A tiny threaded HTTP server answering GETs (and recording PATCHes) with JSON, for the local
stand-ins of remote APIs the tests talk to (no kube-apiserver can run on the build machines)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# (path with query, headers) -> (status, JSON body)
Responder = Callable[[str, Any], tuple[int, dict[str, Any]]]


class JsonServer:
    """GETs answered by ``respond``; PATCH bodies are recorded in ``patches`` (path,
    content type, JSON body) and answered by ``respond`` too."""

    def __init__(self, respond: Responder) -> None:
        outer = self
        self.patches: list[tuple[str, str | None, Any]] = []
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, body = respond(self.path, self.headers)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PATCH(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                outer.patches.append((self.path, self.headers.get("Content-Type"), body))
                self.do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> JsonServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
