"""The hostile-input fuzzer: Hypothesis generates message bodies and returned states
(tests/hostile/fuzz_cases.py); all of them go onto one queue served by two real worker
processes, next to good runs. Invariants once the queue is drained:

- no worker exits (and each stops with exit 0 on SIGTERM);
- every message was deleted: the queue is empty, nothing left in flight or delayed;
- every run is terminal, and a failed run has an error; the good runs all completed;
- every quarantined message has a quarantine row with a known reason code and reached the DLQ
  redacted (one DLQ body per message, none from SQS's redrive); the transition never crashed;
- the canary carried in inputs appears in no log line, DLQ body, reason or error.

CI runs a fixed seed and a small budget; a longer run: ``python -m bench.fuzz --examples N``
(or PHASEGATE_FUZZ_EXAMPLES / PHASEGATE_FUZZ_SEED with pytest).
"""

from __future__ import annotations

import json
import os
from collections import Counter

from hypothesis import HealthCheck, Phase, given, seed
from hypothesis import settings as hsettings

from tests.helpers import fetch, fetchval, queue_for, wait_for
from tests.hostile import workflows_hostile as hw
from tests.hostile.fleet import assert_nothing_leaked, dedup, fleet, runs
from tests.hostile.fuzz_cases import Case, cases
from tests.hostile.test_cases import start

EXAMPLES = int(os.environ.get("PHASEGATE_FUZZ_EXAMPLES", "80"))
SEED = int(os.environ.get("PHASEGATE_FUZZ_SEED", "20261130"))
GOOD_RUNS = 6
KNOWN_CODES = {"not_json", "too_deep", "invalid_envelope", "unknown_workflow", "unknown_phase",
               "unknown_region", "oversized", "group_mismatch", "start_seq", "start_phase",
               "start_branch", "unstorable_input", "no_run", "workflow_mismatch", "seq_ahead",
               "phase_mismatch"}


def generate(examples: int, fixed_seed: int) -> list[Case]:
    generated: list[Case] = []

    @hsettings(max_examples=examples, database=None, deadline=None,
               phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @seed(fixed_seed)
    @given(cases)
    def collect(case: Case) -> None:
        generated.append(case)

    collect()
    return generated


async def send_all(settings, generated: list[Case]) -> None:
    async with queue_for(settings) as queue:
        for i in range(0, len(generated), 10):
            batch = generated[i:i + 10]
            response = await queue._client.send_message_batch(QueueUrl=queue.queue_url, Entries=[
                {"Id": str(n), "MessageBody": c.body, "MessageGroupId": c.group,
                 "MessageDeduplicationId": dedup(c.body)} for n, c in enumerate(batch)])
            assert not response.get("Failed"), response["Failed"]


async def drained(settings) -> bool:
    async with queue_for(settings) as queue:
        depth = await queue.depth()
    if (depth.visible, depth.inflight, depth.delayed) != (0, 0, 0):
        return False
    return int(await fetchval(settings.database_url, "SELECT count(*) FROM workflow_runs "
                              "WHERE status NOT IN ('completed', 'failed')")) == 0


async def test_fuzzed_messages_and_states_end_in_a_defined_state(settings, tmp_path):
    settings = settings.model_copy(update={"max_attempts": 2})
    generated = generate(EXAMPLES, SEED)
    half = len(generated) // 2
    with fleet(settings, tmp_path, workers=2):
        good = [await start(settings, hw.good, {"n": i}) for i in range(GOOD_RUNS // 2)]
        await send_all(settings, generated[:half])
        good += [await start(settings, hw.good, {"n": i}) for i in range(GOOD_RUNS // 2)]
        await send_all(settings, generated[half:])
        await wait_for(lambda: drained(settings), timeout=150, what="queue drained")
    all_runs = await runs(settings)
    assert all(all_runs[g]["status"] == "completed" for g in good)
    for row in all_runs.values():
        assert row["status"] in ("completed", "failed")
        assert (row["status"] == "failed") == (row["error"] is not None)
    reasons = [r["reason"] for r in await fetch(settings.database_url,
                                                "SELECT reason FROM quarantine")]
    assert {reason.split(":")[0] for reason in reasons} <= KNOWN_CODES
    assert await fetchval(settings.database_url, "SELECT count(*) FROM transition_crashes") == 0
    bodies = await assert_nothing_leaked(settings)
    # One DLQ body per quarantined message. A message redelivered after a lost lease may be
    # quarantined twice (two rows, one message id); its second DLQ send has the same dedup id.
    messages = await fetchval(settings.database_url,
                              "SELECT count(DISTINCT message_id) FROM quarantine")
    assert len(bodies) == messages
    assert all("phasegate_quarantined" in json.loads(b) for b in bodies)
    codes = Counter(reason.split(":")[0] for reason in reasons)
    statuses = Counter(row["status"] for row in all_runs.values())
    print(f"fuzz: {len(generated)} messages (seed {SEED}), runs {dict(statuses)}, "
          f"quarantined {dict(codes)}")
