"""`genqueue start`: every Procfile process but `release`, as one supervised stack with a graceful stop.

Not honcho: honcho stops every process as soon as one exits, even with status 0 (the migration
finishing), and SIGKILLs the rest 5 s after a stop, well before a worker finishes its task or
gunicorn drains its requests. Here a process that crashes is restarted (app.supervise's policy
and backoff), one that exits 0 stays down while the others go on, and a stop (SIGTERM/SIGINT)
sends SIGTERM to each process group, waits `stop_timeout_s`, then SIGQUIT (Celery's cold
shutdown: acks_late tasks go back to the queue), then SIGKILL. Each process gets the
parent-death signal too (app.supervise.die_with_parent), for a SIGKILL of the stack itself.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO, TextIO

from app.supervise import Spawn, Supervisor, die_with_parent, group_alive, signal_group

log = logging.getLogger("genqueue.stack")

RELEASE = "release"  # the Procfile convention for the one-off step before a deploy (migrations)
PROCFILE_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$")  # honcho's and Heroku's grammar
QUIT_WAIT_S = 5.0  # after SIGQUIT, before SIGKILL
_ASSIGNMENTS = re.compile(r"""^((?:[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|"[^"]*"|[^\s'"])*\s+)*)""")
_SHELL_SYNTAX = re.compile(r"[;&|<>`\n]|\$\(")


def exec_form(cmd: str) -> str:
    """`cmd` with `exec` before its command word, so the shell becomes the process (it then gets
    the parent-death signal and the stop signal itself); a line with shell syntax (`;`, `&&`,
    pipes, redirections, `$(...)`) is left to its shell. `A=1 exec cmd` keeps A for cmd (POSIX)."""
    if _SHELL_SYNTAX.search(cmd):
        return cmd
    assignments = _ASSIGNMENTS.match(cmd)
    head = assignments.group(1) if assignments else ""
    return f"{head}exec {cmd[len(head) :]}"


def read_procfile(path: Path) -> dict[str, str]:
    """{process name: shell command}, in file order."""
    processes: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = PROCFILE_LINE.match(line)
        if m:
            processes[m.group(1)] = m.group(2)
    return processes


class _Output:
    """Each process's lines on one stream, prefixed with its name (like honcho), whole lines only."""

    def __init__(self, out: TextIO, names: list[str]) -> None:
        self.out, self.width = out, max(len(n) for n in [*names, "stack"])
        self.lock = threading.Lock()

    def line(self, name: str, text: str) -> None:
        with self.lock:
            self.out.write(f"{time.strftime('%H:%M:%S')} {name:<{self.width}} | {text.rstrip()}\n")
            self.out.flush()

    def pump(self, name: str, stream: IO[bytes]) -> None:
        with stream:
            for raw in stream:
                self.line(name, raw.decode("utf-8", errors="replace"))


class _ToOutput(logging.Handler):
    def __init__(self, output: _Output) -> None:
        super().__init__()
        self.output = output

    def emit(self, record: logging.LogRecord) -> None:
        self.output.line("stack", f"{record.levelname} {record.getMessage()}")


class Stack:
    """The processes, each under a Supervisor in its own thread; `run()` blocks until all are done."""

    def __init__(
        self,
        processes: Mapping[str, str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        out: TextIO,
        stop_timeout_s: float,
        backoff_s: float,
        backoff_max_s: float,
    ) -> None:
        self.env, self.cwd, self.stop_timeout_s = dict(env), cwd, stop_timeout_s
        self.output = _Output(out, list(processes))
        self.supervisors = {
            name: Supervisor(
                ["/bin/sh", "-c", cmd],
                name=name,
                backoff_s=backoff_s,
                backoff_max_s=backoff_max_s,
                spawn=self._spawner(name, cmd),
                group=True,
            )
            for name, cmd in processes.items()
        }
        self.status: dict[str, int] = {}
        self._stop_requested = threading.Event()
        self._forced = threading.Event()
        self._pumps: list[threading.Thread] = []

    def _spawner(self, name: str, cmd: str) -> Spawn:
        def spawn() -> subprocess.Popen[bytes]:
            child = subprocess.Popen(
                die_with_parent(["/bin/sh", "-c", exec_form(cmd)]),
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a group per process: signalled and waited for as one
            )
            assert child.stdout is not None
            pump = threading.Thread(target=self.output.pump, args=(name, child.stdout), daemon=True)
            pump.start()
            self._pumps.append(pump)
            log.info("%s started (pid %d): %s", name, child.pid, cmd)
            return child

        return spawn

    def _supervise(self, name: str) -> None:
        status = self.supervisors[name].run()
        self.status[name] = status
        if not self._stop_requested.is_set():
            log.warning("%s exited with status %d and stays down; the others keep running", name, status)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._stop_requested.is_set():
            log.warning("%s again: killing what is left now", signal.Signals(signum).name)
            self._forced.set()
        self._stop_requested.set()

    def _alive(self) -> list[str]:
        return [
            name
            for name, sup in self.supervisors.items()
            if name not in self.status or (sup.child is not None and group_alive(sup.child.pid))
        ]

    def _escalate(self, signum: int) -> None:
        for name in self._alive():
            child = self.supervisors[name].child
            if child is not None:
                log.warning("%s still running: %s", name, signal.Signals(signum).name)
                signal_group(child.pid, signum)

    def run(self) -> int:
        """Start everything, wait for a stop signal (or every process to exit); 0 when all stopped
        in time, 1 when some had to be killed."""
        handler = _ToOutput(self.output)
        loggers = [log, logging.getLogger("genqueue.supervise")]
        saved = [(lg.level, lg.propagate) for lg in loggers]
        for lg in loggers:  # the stack's own lines go with the processes' lines, not to stderr
            lg.addHandler(handler)
            lg.setLevel(logging.INFO)
            lg.propagate = False
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        threads = [threading.Thread(target=self._supervise, args=(n,), daemon=True) for n in self.supervisors]
        try:
            for t in threads:
                t.start()
            while not self._stop_requested.wait(0.2):
                if not any(t.is_alive() for t in threads):
                    return max(self.status.values(), default=0)
            log.info("stopping: SIGTERM to %s", ", ".join(self._alive()))
            for sup in self.supervisors.values():
                sup.signal(signal.SIGTERM)
            forced = not self._wait_all(threads, self.stop_timeout_s)
            if forced:
                self._escalate(signal.SIGQUIT)
                if not self._wait_all(threads, QUIT_WAIT_S):
                    self._escalate(signal.SIGKILL)
                    self._wait_all(threads, QUIT_WAIT_S)
            log.info("stopped%s", " (some processes had to be forced)" if forced else "")
            return 1 if forced else 0
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            for pump in self._pumps:  # the last lines of the processes that just exited
                pump.join(timeout=1)
            for lg, (level, propagate) in zip(loggers, saved, strict=True):
                lg.removeHandler(handler)
                lg.setLevel(level)
                lg.propagate = propagate

    def _wait_all(self, threads: list[threading.Thread], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(t.is_alive() for t in threads):
            if time.monotonic() > deadline or self._forced.is_set():
                return False
            time.sleep(0.1)
        return True


def stack_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The processes' environment: this interpreter's bin directory first on PATH (gunicorn,
    celery and genqueue of the same venv without activating it), unbuffered Python output."""
    env = dict(environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", os.defpath)])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
