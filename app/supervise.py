"""`genqueue worker`: run a Celery worker as a child and restart it when it exits unexpectedly.

The safety net under tasks.kombu_fixes: whatever makes a worker exit (an unrecoverable error
in kombu or Celery, the OOM killer, a segfault in a model library), it comes back after a
backoff instead of staying down; under honcho one exiting process stops the whole stack.
A stop signal (SIGTERM, SIGINT, SIGQUIT) is forwarded once and ends supervision; a clean
exit (status 0, e.g. `celery control shutdown`) is not restarted either.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

log = logging.getLogger("genqueue.supervise")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
FORWARDED = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)  # Celery's own meanings, passed on
PR_SET_PDEATHSIG = 1


def celery_worker_command(args: Sequence[str], *, quiet: bool = False) -> list[str]:
    """`quiet`: no startup banner, which Celery prints as plain text (not a log line)."""
    banner = ["--quiet"] if quiet else []
    return [sys.executable, "-m", "celery", "-A", "tasks.worker", *banner, "worker", *args]


def _die_with_parent() -> None:
    # Runs in the child before exec: if the supervisor is SIGKILLed, the worker gets SIGTERM
    # (a warm shutdown) instead of living on unsupervised. Linux only; elsewhere a no-op.
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128 + N


def supervise(
    cmd: Sequence[str],
    *,
    backoff_s: float = 1.0,
    backoff_max_s: float = 30.0,
    stable_s: float = 60.0,
    max_restarts: int | None = None,
) -> int:
    """Run `cmd` until stopped; restart it after an unexpected exit. Returns the exit status.

    The wait before a restart doubles per quick exit (one within `stable_s` of its start) up
    to `backoff_max_s`, so a worker that cannot start does not spin; a run that lasted
    longer starts the wait over.
    """
    stop = threading.Event()
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if signum in STOP_SIGNALS:
            stop.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, on_signal) for s in (*STOP_SIGNALS, *FORWARDED)}
    try:
        delay, restarts = backoff_s, 0
        while True:
            if stop.is_set():  # stopped during the backoff wait's last instant
                return 0
            started = time.monotonic()
            # Its own session: a terminal's Ctrl-C or honcho's group signal reaches the worker
            # once, through us, not twice (a second SIGINT would make Celery cold-stop).
            child = subprocess.Popen(list(cmd), start_new_session=True, preexec_fn=_die_with_parent)
            status = _exit_status(child.wait())
            if stop.is_set() or status == 0:
                return status
            if max_restarts is not None and restarts >= max_restarts:
                log.error("worker exited with status %s; %d restarts used, giving up", status, restarts)
                return status
            if time.monotonic() - started > stable_s:
                delay = backoff_s
            restarts += 1
            log.warning("worker exited with status %s; restart %d in %.1fs", status, restarts, delay)
            if stop.wait(delay):
                return status
            delay = min(delay * 2, backoff_max_s)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
