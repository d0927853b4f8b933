"""What the API's token check costs: ``TokenFile.lookup`` (stat the file, sha256 the token,
compare against every line in constant time) with 10 and 1000 tokens, against a raw baseline
in the same process -- one sha256 and one ``hmac.compare_digest``, the least any digest check
does.

    python -m bench.auth [--rounds 20000]
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

from orchestrator.auth import TokenFile, new_token, token_line


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for tokens in (10, 1000):
            print(json.dumps({k: round(v, 2) for k, v in
                              measure(tokens, args.rounds, Path(folder)).items()}))


if __name__ == "__main__":
    main()
