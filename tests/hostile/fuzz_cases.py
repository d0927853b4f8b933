"""Hypothesis strategies for what a hostile or careless producer puts on the queue: message
bodies (raw text, deep JSON, envelopes with wrong types, unicode edge cases, huge numbers) and
the states phases return (built by ``workflows_hostile.shapes`` from a storable spec)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from tests.hostile.fleet import CANARY

# Characters that break things: NUL, lone surrogates, BOM, RTL override, combining marks,
# non-characters, astral emoji, line separators.
EDGE_CHARS = ["\x00", "\ud800", "\udfff", "\ufeff", "\u202e", "e\u0301", "\uffff", "\U0001f600",
              "\u2028", "\\", '"', "\n", "\x7f"]
# What SQS accepts in a body, escaped or not (it refuses NUL and lone surrogates raw).
SQS_TEXT = st.characters(min_codepoint=0x20, max_codepoint=0xD7FF)

edge_text = st.lists(st.one_of(st.sampled_from(EDGE_CHARS), st.text(max_size=8)),
                     max_size=6).map("".join)
numbers = st.one_of(st.integers(), st.integers(min_value=2**63, max_value=10**40),
                    st.floats(allow_nan=True, allow_infinity=True))
leaves = st.one_of(st.none(), st.booleans(), numbers, edge_text, st.just(CANARY))
json_values = st.recursive(
    leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                    st.dictionaries(edge_text, inner, max_size=4)),
    max_leaves=12)

WORKFLOWS = ["good", "shapes", "exits", "returns", "nope"]
fuzz_ids = st.one_of(st.from_regex(r"fz-[a-z0-9]{1,6}", fullmatch=True), st.text(max_size=12))


@dataclass(frozen=True)
class Case:
    body: str
    group: str


def nested_spec(depth: int) -> Any:
    return {"$deep": depth}


# What the "shapes" phase turns into its returned state.
spec_leaves = st.one_of(
    st.sampled_from(["<NUL>", "<SUR>", "<LOW>", "plain", CANARY + "<NUL>"]),
    st.builds(lambda d: {"$deep": d}, st.sampled_from([3, 63, 64, 65, 500])),
    st.builds(lambda d: {"$int": d}, st.sampled_from([1, 20, 400, 4299, 5000])),
    st.builds(lambda f: {"$float": f}, st.sampled_from(["nan", "inf", "-inf", "1e308"])),
    st.integers(), st.text(alphabet=SQS_TEXT, max_size=10))
state_specs = st.recursive(
    spec_leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "<NUL>", "<SUR>", CANARY]), inner, max_size=3)),
    max_leaves=6)


def mostly(draw: st.DrawFn, valid: st.SearchStrategy[Any],
           hostile: st.SearchStrategy[Any]) -> Any:
    """A valid value nine times in ten: most messages get deep into the transition, each
    with an odd field or two, rather than all failing at the first check."""
    # Hypothesis leans towards the smallest integer, so the rare branch is the largest.
    return draw(hostile) if draw(st.integers(0, 9)) == 9 else draw(valid)


@st.composite
def envelopes(draw: st.DrawFn) -> Case:
    wid = mostly(draw, st.from_regex(r"fz-[a-z0-9]{1,4}", fullmatch=True),
                 st.text(max_size=12))
    workflow = mostly(draw, st.sampled_from(WORKFLOWS[:-1]), st.just("nope") | edge_text)
    kind = mostly(draw, st.just("start"),
                  st.sampled_from(["phase", "merge", "deadline"]) | edge_text)
    body: dict[str, Any] = {
        "v": mostly(draw, st.just(1), st.sampled_from([True, 1.0, 2, "1", None])),
        "kind": kind, "workflow_id": wid, "workflow": workflow}
    if kind != "start" or draw(st.integers(0, 3)) == 3:
        body["seq"] = mostly(draw, st.integers(0, 3), st.one_of(
            st.integers(-2, -1), st.integers(2**31 - 2, 2**70), st.floats(), edge_text))
    if kind != "start" or draw(st.integers(0, 3)) == 3:
        body["phase"] = mostly(draw, st.sampled_from(["one", "two", "shape", "after", "leave"]),
                               edge_text)
    if draw(st.integers(0, 5)) == 5:
        body["branch"] = draw(st.sampled_from(["main", "b1"]) | edge_text)
    if kind == "start":
        if workflow == "shapes":
            body["input"] = {"emit": draw(state_specs), "c": CANARY}
        else:
            body["input"] = draw(json_values)
    elif draw(st.integers(0, 9)) == 9:
        body["input"] = draw(json_values)
    if draw(st.integers(0, 9)) == 9:
        body[draw(edge_text)] = CANARY  # an unknown field
    branch = body.get("branch", "main")
    own = wid if branch == "main" or not isinstance(branch, str) else f"{wid}/{branch}"
    group = mostly(draw, st.just(own), st.just("someone-else"))
    # ensure_ascii: NUL and lone surrogates travel as JSON escapes (SQS refuses them raw).
    return Case(json.dumps(body), _sqs_group(group))


def _sqs_group(group: str) -> str:
    """SQS itself refuses group ids outside 1-128 printable ASCII; such a producer's send
    fails at SQS, so the fuzzer sends those under a stand-in group."""
    ok = 0 < len(group) <= 128 and all(33 <= ord(c) <= 126 for c in group)
    return group if ok else "unsendable-group"


raw_bodies = st.one_of(
    st.text(alphabet=SQS_TEXT, min_size=1, max_size=60),
    st.sampled_from([2, 63, 64, 65, 990, 5000, 100_000]).map(
        lambda d: "[" * d + '"' + CANARY + '"' + "]" * d),
    st.builds(lambda v: json.dumps(v), json_values),
).map(lambda body: Case(body, "raw-fuzz"))

cases = st.one_of(envelopes(), envelopes(), envelopes(), raw_bodies)
