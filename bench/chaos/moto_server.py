"""moto's SQS server for the chaos run, with one thread-safety fix applied first.

moto's threaded server rebuilds a queue's message list in ``Queue.delete_message`` without the
lock ``Queue.add_message`` appends under, so a send that lands during a delete can vanish (and
a receive of it can leave its FIFO group locked for good). The long chaos run (seed 7) lost a
message that way. Real SQS does not lose acknowledged messages, so the suite runs moto with
deletes under the same lock; losing messages on purpose is the proxy's ``send_lost`` fault.

Run as ``python -m bench.chaos.moto_server -H 127.0.0.1 -p PORT``.
"""

from __future__ import annotations

import functools
from typing import Any

from moto.server import main
from moto.sqs.models import Queue

_unlocked_delete = Queue.delete_message


@functools.wraps(_unlocked_delete)
def _delete_message(self: Queue, receipt_handle: str) -> Any:
    with self._messages_lock:
        return _unlocked_delete(self, receipt_handle)


Queue.delete_message = _delete_message  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
