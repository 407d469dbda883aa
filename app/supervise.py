"""Restart supervision: run a command as a child and restart it when it exits unexpectedly.

`genqueue worker` is the safety net under tasks.kombu_fixes: whatever makes a worker exit (an
unrecoverable error in kombu or Celery, the OOM killer, a segfault in a model library), it comes
back after a backoff instead of staying down. `genqueue start` (app.stack) keeps every Procfile
process under the same policy. A stop signal (SIGTERM, SIGINT, SIGQUIT) is forwarded once and
ends supervision; a clean exit (status 0, e.g. `celery control shutdown`) is not restarted either.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

from models.settings import Settings

log = logging.getLogger("genqueue.supervise")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
FORWARDED = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)  # Celery's own meanings, passed on
# After a crash, what is left of the child's process group gets this long before SIGKILL, so a
# restart never runs next to a leftover of the previous run.
LINGER_S = 10.0

Spawn = Callable[[], "subprocess.Popen[bytes]"]
# Called with the child's pid, its raw return code (-N: killed by signal N) and its start (Unix
# time) after each run, before any restart: where the next run needs the last one's leftovers
# put right first.
OnExit = Callable[[int, int, float], object]


def celery_worker_command(args: Sequence[str], *, quiet: bool = False) -> list[str]:
    """`quiet`: no startup banner, which Celery prints as plain text (not a log line)."""
    banner = ["--quiet"] if quiet else []
    return [sys.executable, "-m", "celery", "-A", "tasks.worker", *banner, "worker", *args]


def worker_environment(settings: Settings, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The worker's environment: PROMETHEUS_MULTIPROC_DIR is its own metrics directory, or unset.

    prometheus_client picks its storage when it is imported, and the Celery command imports it
    (through Flower's plugin) before any code of ours runs, so the variable must be there when
    the process starts. An inherited one (gunicorn's) is another server's directory: dropped.
    The worker empties its directory itself, once it holds the port (tasks.metrics_server).
    """
    env = {k: v for k, v in environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    if settings.worker_metrics_port:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(settings.worker_metrics_files)
    return env


@functools.cache
def _setpriv() -> str | None:
    """util-linux's setpriv where it knows --pdeathsig (2.33+, Linux), looked up once; else None."""
    path = shutil.which("setpriv")
    usage = ""
    if path is not None:
        try:
            usage = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            pass
    if path is None or "--pdeathsig" not in usage:
        # Said once (the answer is cached): a SIGKILLed supervisor now leaves its children running.
        log.warning("no setpriv with --pdeathsig (util-linux 2.33+): children outlive a killed supervisor")
        return None
    return path


def die_with_parent(cmd: Sequence[str]) -> list[str]:
    """`cmd` run so that if its parent (the supervisor) is SIGKILLed, it gets SIGTERM (a warm
    shutdown) instead of living on unsupervised; `cmd` unchanged where setpriv cannot do it.

    setpriv sets the parent-death signal and execs the command (same pid; the signal survives
    the exec of anything but a set-user-ID, set-group-ID or file-capability program). Not a
    preexec_fn: that makes subprocess fork() instead of vfork() and run Python in the child of
    a threaded parent, where at-fork handlers and locks other threads held at the fork can hang
    the child before its exec, and Popen with it (the suite's process hung so in
    tests/test_supervise.py).
    """
    setpriv = _setpriv()
    if setpriv is None:
        return list(cmd)
    return [setpriv, "--pdeathsig", "TERM", "--", *cmd]


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128 + N


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


class Supervisor:
    """One command kept running: restarted after an unexpected exit, stopped on request.

    The wait before a restart doubles per quick exit (one within `stable_s` of its start) up
    to `backoff_max_s`, so a child that cannot start does not spin; a run that lasted longer
    starts the wait over. The child runs in its own session: a terminal's Ctrl-C or a group
    signal reaches it once, through `signal()`, not twice (a second SIGINT makes Celery
    cold-stop). `group=True` signals the child's whole process group (a shell and what it
    runs) and waits for all of it, not only for the child, before the run counts as over.
    """

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        name: str = "worker",
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        stable_s: float = 60.0,
        max_restarts: int | None = None,
        spawn: Spawn | None = None,
        group: bool = False,
        env: Mapping[str, str] | None = None,
        on_exit: OnExit | None = None,
    ) -> None:
        self.cmd, self.name, self.group, self.env = list(cmd), name, group, env
        self.on_exit = on_exit
        self.backoff_s, self.backoff_max_s, self.stable_s = backoff_s, backoff_max_s, stable_s
        self.max_restarts = max_restarts
        self._spawn = spawn or self._spawn_plain
        self._stop = threading.Event()
        self._lock = threading.RLock()  # signal() may run in a handler inside run()'s lock
        self.child: subprocess.Popen[bytes] | None = None

    def _spawn_plain(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(die_with_parent(self.cmd), env=self.env, start_new_session=True)

    def stopping(self) -> bool:
        return self._stop.is_set()

    def signal(self, signum: int) -> None:
        """Pass `signum` on to the child; a stop signal also ends supervision."""
        with self._lock:
            if signum in STOP_SIGNALS:
                self._stop.set()
            child = self.child
            if child is None:
                return
            if self.group:
                signal_group(child.pid, signum)
            elif child.poll() is None:
                child.send_signal(signum)

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        status = _exit_status(child.wait())
        if not self.group:
            return status
        # A shell dies of SIGTERM at once while the command it started drains: the run is over
        # when the group is empty. While stopping, the caller bounds this wait (and kills).
        deadline = time.monotonic() + LINGER_S
        while group_alive(child.pid):
            if not self.stopping() and time.monotonic() > deadline:
                signal_group(child.pid, signal.SIGKILL)
            time.sleep(0.1)
        return status

    def _after(self, child: subprocess.Popen[bytes], started_at: float) -> None:
        if self.on_exit is None:
            return
        try:
            self.on_exit(child.pid, child.returncode, started_at)
        except Exception:  # a failed clean-up must not stop supervision
            log.exception("%s: clean-up after pid %d failed", self.name, child.pid)

    def run(self) -> int:
        """Run until stopped or cleanly exited; returns the last exit status."""
        delay, restarts = self.backoff_s, 0
        while True:
            with self._lock:
                if self.stopping():  # stopped during the backoff wait's last instant
                    return 0
                started, started_at = time.monotonic(), time.time()
                self.child = child = self._spawn()
            if self.stopping():  # a stop signal came while it was being started
                self.signal(signal.SIGTERM)
            status = self._wait(child)
            self._after(child, started_at)
            if self.stopping() or status == 0:
                return status
            if self.max_restarts is not None and restarts >= self.max_restarts:
                log.error(
                    "%s exited with status %s; %d restarts used, giving up", self.name, status, restarts
                )
                return status
            if time.monotonic() - started > self.stable_s:
                delay = self.backoff_s
            restarts += 1
            log.warning("%s exited with status %s; restart %d in %.1fs", self.name, status, restarts, delay)
            if self._stop.wait(delay):
                return status
            delay = min(delay * 2, self.backoff_max_s)


def supervise(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    backoff_s: float = 1.0,
    backoff_max_s: float = 30.0,
    stable_s: float = 60.0,
    max_restarts: int | None = None,
    on_exit: OnExit | None = None,
) -> int:
    """Supervise `cmd` in this (main) thread, taking the stop signals; returns the exit status."""
    sup = Supervisor(
        cmd,
        env=env,
        on_exit=on_exit,
        backoff_s=backoff_s,
        backoff_max_s=backoff_max_s,
        stable_s=stable_s,
        max_restarts=max_restarts,
    )

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        sup.signal(signum)

    previous = {s: signal.signal(s, on_signal) for s in (*STOP_SIGNALS, *FORWARDED)}
    try:
        return sup.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
