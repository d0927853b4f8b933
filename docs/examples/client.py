"""Start a run over HTTP, wait for it, and meet a refusal (docs/how-to/client.md).

Needs only the orchestrator's URL and a token: no database, no SQS credentials, no workflow
code. ``tests/integration/test_client.py`` runs this file against a real orchestrator and
worker, so the page cannot drift from what the client does::

    PHASEGATE_API_URL=http://127.0.0.1:8080 PHASEGATE_API_TOKEN=pgt_... python client.py
"""

import os
import sys

from phasegate.client import Client, Conflict


def main(url: str) -> int:
    # The token comes from PHASEGATE_API_TOKEN (or the file PHASEGATE_API_TOKEN_FILE names).
    with Client(url) as api:
        order = {"order_id": "o-7", "items": [{"sku": "tea", "cents": 450, "qty": 2}]}
        # An id of our own makes the start idempotent: sending it twice starts one run.
        run = api.start("order-receipt", order, workflow_id="order-o-7")
        print(f"started {run.workflow_id}: {run.status}")
        # A long poll: one request every 25 s at most while the run moves, not a busy loop.
        done = api.wait(run.workflow_id, timeout=120)
        print(f"{done.workflow_id} is {done.status}")
        try:
            api.cancel(done.workflow_id)
        except Conflict as refused:  # 409, with the API's own reason in refused.detail
            print(f"cannot cancel {done.workflow_id}: HTTP {refused.status}")
    return 0 if done.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main(os.environ.get("PHASEGATE_API_URL", "http://127.0.0.1:8080")))
