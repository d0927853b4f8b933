"""What the API's token check costs: ``TokenFile.lookup`` (stat the file, sha256 the token,
compare against every line in constant time) with 10 and 1000 tokens, against a raw baseline
in the same process -- one sha256 and one ``hmac.compare_digest``, the least any digest check
does. Then a whole request through the ASGI app in process (``GET /v1/stalls`` with a
threshold out of range: the gate admits it and the route answers 422 before any I/O; every
/v1 route that succeeds reads the database) with tokens against the same request with
``PHASEGATE_API_AUTH=none``.

    python -m bench.auth [--rounds 20000] [--requests 1000]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from phasegate.orchestrator.auth import TokenFile, new_token, token_line

# Admitted by the gate (viewer), refused by validation: the whole request path, no database.
NO_IO_REQUEST = "/v1/stalls?older_than_s=-1"


def per_call_s(fn: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(5):  # the best of five passes: the least disturbed by other processes
        started = time.perf_counter()
        for _ in range(rounds):
            fn()
        best = min(best, (time.perf_counter() - started) / rounds)
    return best


def measure(tokens: int, rounds: int, folder: Path) -> dict[str, float]:
    issued = [new_token() for _ in range(tokens)]
    path = folder / f"tokens-{tokens}"
    path.write_text("".join(token_line(f"t{i}", ["viewer"], t) + "\n"
                            for i, t in enumerate(issued)))
    table = TokenFile(path)
    last = issued[-1]
    expected = hashlib.sha256(last.encode()).digest()

    def raw() -> bool:
        return hmac.compare_digest(hashlib.sha256(last.encode()).digest(), expected)

    assert table.lookup(last) is not None and raw()
    baseline = per_call_s(raw, rounds)
    lookup = per_call_s(lambda: table.lookup(last), max(1, rounds // max(1, tokens // 10)))
    return {"tokens": tokens, "baseline_us": baseline * 1e6, "lookup_us": lookup * 1e6,
            "ratio": lookup / baseline}


async def requests_per_s(auth: object, token: str, count: int) -> float:
    import types

    import httpx

    from phasegate.orchestrator.api import Services, create_app
    from phasegate.orchestrator.fleet import FleetView

    services = Services(control=types.SimpleNamespace(), queue=None,  # type: ignore[arg-type]
                        fleet=FleetView(None, reason="bench"), auth=auth)  # type: ignore[arg-type]
    app = create_app(services)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://b",
                                 headers={"Authorization": f"Bearer {token}"}) as client:
        assert (await client.get(NO_IO_REQUEST)).status_code == 422
        started = time.perf_counter()
        for _ in range(count):
            await client.get(NO_IO_REQUEST)
        return (time.perf_counter() - started) / count


def measure_requests(folder: Path, count: int) -> list[dict[str, float]]:
    import asyncio

    from phasegate.orchestrator.auth import NoAuth

    baseline = min(asyncio.run(requests_per_s(NoAuth(), "x", count)) for _ in range(3))
    rows = []
    for tokens in (10, 1000):
        issued = [new_token() for _ in range(tokens)]
        path = folder / f"request-tokens-{tokens}"
        path.write_text("".join(token_line(f"t{i}", ["viewer"], t) + "\n"
                                for i, t in enumerate(issued)))
        with_tokens = min(asyncio.run(requests_per_s(TokenFile(path), issued[-1], count))
                          for _ in range(3))
        rows.append({"tokens": tokens, "request_no_auth_us": baseline * 1e6,
                     "request_tokens_us": with_tokens * 1e6, "ratio": with_tokens / baseline})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    from phasegate.logs import configure_logging

    # The access-log line is the same with and without tokens; printing it would time the
    # terminal, not the check.
    configure_logging("warning", "json")
    with tempfile.TemporaryDirectory() as folder:
        for tokens in (10, 1000):
            print(json.dumps({k: round(v, 2) for k, v in
                              measure(tokens, args.rounds, Path(folder)).items()}))
        for row in measure_requests(Path(folder), args.requests):
            print(json.dumps({k: round(v, 2) for k, v in row.items()}))


if __name__ == "__main__":
    main()
