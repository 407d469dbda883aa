"""The hard time limit where Celery's pool has none: a generate() call past it ends the worker process.

Why: the threads pool enforces no time limit. The batcher (tasks/batching.py) lets each caller
leave at its soft deadline, so the job records `timeout`, but nothing can interrupt the call itself
from outside: a model stuck in a CUDA kernel or a deadlock holds the batcher's collector thread for
good, and every later job of that model in the process waits out its own soft limit and times out.
A prefork pool kills such a child at the hard limit; here the process does the same to itself.

How: a call that outlives its stage's hard limit (`*_time_limit_s`, counted from the call's start)
sends the process SIGQUIT, Celery's cold shutdown: the broker connections close (RabbitMQ requeues
the unacked messages of the other tasks in flight, kombu's Redis transport restores them at once),
the exit status is 1, and `genqueue worker` (app/supervise.py) starts a fresh process with a fresh
model. Should the shutdown itself hang (the stuck call never gives the interpreter back), the
process leaves with os._exit after EXIT_GRACE_S.

Armed only in a worker started from the command line (`arm`, called at worker_ready for a pool that
is not prefork): in-process workers (the embedded demo, the test suite's thread workers) share their
process with other work, and a prefork child has the pool's own limits.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.platforms import EX_FAILURE

log = logging.getLogger("genqueue.hang_guard")

EXIT_GRACE_S = 30.0  # after the SIGQUIT, how long the cold shutdown may take before os._exit

_cond = threading.Condition()
_calls: dict[int, tuple[float, str, float]] = {}  # token -> (deadline, what, limit_s)
_tokens = itertools.count()
_thread: threading.Thread | None = None  # the watcher: started by arm(), None while unarmed
_controller: Any = None  # the Celery WorkController whose exit status the cold shutdown returns


def arm(controller: Any = None) -> None:
    """From now on, a guarded call past its limit ends this process (idempotent)."""
    global _thread, _controller
    with _cond:
        _controller = controller
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_watch, name="hang-guard", daemon=True)
            _thread.start()
        _cond.notify()


def armed() -> bool:
    return _thread is not None


@contextmanager
def guarded(what: str, limit_s: float) -> Iterator[None]:
    """Run the body under a hard limit of `limit_s` seconds (ignored unless armed, or when <= 0)."""
    if limit_s <= 0 or _thread is None:  # unarmed: nothing would ever look at the entry
        yield
        return
    token = next(_tokens)
    with _cond:
        _calls[token] = (time.monotonic() + limit_s, what, limit_s)
        _cond.notify()
    try:
        yield
    finally:
        with _cond:
            _calls.pop(token, None)


def _watch() -> None:
    with _cond:
        while True:
            now = time.monotonic()
            overdue = [(what, limit) for deadline, what, limit in _calls.values() if deadline <= now]
            if overdue:
                break
            # Sleep until the earliest deadline; a new call wakes the thread early.
            wake = min((d for d, _, _ in _calls.values()), default=now + 3600.0) - now
            _cond.wait(max(wake, 0.01))
    what, limit = overdue[0]
    _end_process(what, limit)


def _end_process(what: str, limit_s: float) -> None:
    log.critical(
        "generate() of %s still running after its hard time limit (%.0f s): ending worker process %d "
        "(cold shutdown) so that a fresh one takes over",
        what, limit_s, os.getpid(),
    )  # fmt: skip
    # Daemon: a cold shutdown that finishes ends the process, and this timer with it.
    timer = threading.Timer(EXIT_GRACE_S, os._exit, (os.EX_SOFTWARE,))
    timer.daemon = True
    timer.start()
    # Celery's cold shutdown leaves the exit status as it was (0 unless set): supervision must
    # see a failure, or it takes the exit for a requested stop and leaves the worker down.
    if _controller is not None:
        _controller.exitcode = EX_FAILURE  # celery.platforms' status for a failed worker
    os.kill(os.getpid(), signal.SIGQUIT)
