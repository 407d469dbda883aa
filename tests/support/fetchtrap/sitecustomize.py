"""Test-only hook: hold a Redis worker between taking a message and recording it as unacked.

Put this folder on a worker's PYTHONPATH with GENQUEUE_TEST_FETCH_TRAP=<file>: a message whose
task id is listed in that file is held inside kombu's QoS.append, after BRPOP took it and before
the `unacked` write, and its id is appended to <file>.hit, so a test can SIGKILL the worker
exactly in the window where a real kill loses the message.
"""

from __future__ import annotations

import os
import time
from typing import Any

_TRAP = os.environ.get("GENQUEUE_TEST_FETCH_TRAP")

if _TRAP:
    from kombu.transport import redis as _kombu_redis

    _append = _kombu_redis.QoS.append

    def _trapped_append(self: Any, message: Any, delivery_tag: Any) -> Any:
        task_id = (message.headers or {}).get("id")
        try:
            with open(_TRAP) as f:
                wanted = f.read().split()
        except FileNotFoundError:
            wanted = []
        if task_id in wanted:
            with open(f"{_TRAP}.hit", "a") as f:
                f.write(f"{task_id}\n")
            time.sleep(600)  # until the test kills us
        return _append(self, message, delivery_tag)

    _kombu_redis.QoS.append = _trapped_append
