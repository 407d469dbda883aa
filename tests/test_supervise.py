"""`genqueue worker`'s supervision (app.supervise): restart after an unexpected exit, stop on a signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from app.supervise import supervise, worker_environment
from models.settings import Settings
from tests.support.procs import ROOT, wait_for


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_a_child_that_exits_unexpectedly_is_restarted_until_it_exits_cleanly(tmp_path):
    runs = tmp_path / "runs"
    cmd = _script(
        tmp_path,
        f"""
        import os, sys
        from pathlib import Path
        runs = Path({str(runs)!r})
        n = len(runs.read_text()) if runs.exists() else 0
        runs.write_text("x" * (n + 1))
        if n == 1:
            os.kill(os.getpid(), 9)  # killed, as the OOM killer would
        sys.exit(1 if n < 3 else 0)  # 1: Celery's "Unrecoverable error" status
        """,
    )
    assert supervise(cmd, backoff_s=0.01, backoff_max_s=0.02) == 0
    assert runs.read_text() == "xxxx"  # three unexpected exits, three restarts


def test_each_run_ends_in_on_exit_with_its_pid_and_return_code_before_the_restart(tmp_path):
    runs = tmp_path / "runs"
    cmd = _script(
        tmp_path,
        f"""
        import os
        from pathlib import Path
        runs = Path({str(runs)!r})
        n = len(runs.read_text()) if runs.exists() else 0
        runs.write_text("x" * (n + 1))
        if n == 0:
            os.kill(os.getpid(), 9)
        raise SystemExit(0)
        """,
    )
    seen: list[tuple[int, int, int, float]] = []  # pid, return code, runs so far, start
    before = time.time()
    on_exit = lambda pid, rc, at: seen.append((pid, rc, len(runs.read_text()), at))  # noqa: E731
    assert supervise(cmd, backoff_s=0.01, on_exit=on_exit) == 0
    assert [(rc, n) for _, rc, n, _ in seen] == [(-9, 1), (0, 2)]  # each before the next run
    assert seen[0][0] != seen[1][0]
    assert before <= seen[0][3] <= seen[1][3] <= time.time()


def test_restarts_stop_at_max_restarts_with_the_last_status(tmp_path):
    runs = tmp_path / "runs"
    cmd = _script(
        tmp_path,
        f"""
        from pathlib import Path
        p = Path({str(runs)!r})
        p.write_text((p.read_text() if p.exists() else "") + "x")
        raise SystemExit(3)
        """,
    )
    assert supervise(cmd, backoff_s=0.01, backoff_max_s=0.01, max_restarts=2) == 3
    assert runs.read_text() == "xxx"


def test_sigterm_is_forwarded_once_and_ends_supervision(tmp_path):
    got = tmp_path / "signals"
    child = tmp_path / "child.py"
    child.write_text(
        textwrap.dedent(
            f"""
            import signal, sys, time
            from pathlib import Path
            out = Path({str(got)!r})
            def on_term(signum, frame):
                out.write_text(out.read_text() + "TERM " if out.exists() else "TERM ")
                time.sleep(0.3)  # a warm shutdown takes a while; a second signal would land here
                sys.exit(1)  # even a failing stop is not restarted: it was asked to stop
            signal.signal(signal.SIGTERM, on_term)
            out.write_text(out.read_text() + "START " if out.exists() else "START ")
            while True:
                time.sleep(0.05)
            """
        )
    )
    code = (
        "import sys; from app.supervise import supervise; "
        f"sys.exit(supervise([sys.executable, {str(child)!r}], backoff_s=0.01))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True)
    try:
        wait_for(got.exists, 30, 0.05, "the child to start")
        kids = psutil.Process(proc.pid).children()
        assert len(kids) == 1
        # As honcho stops a process: SIGTERM to its whole process group.
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 1  # the worker's own status
        assert got.read_text() == "START TERM "  # once, through the supervisor; no restart after
        psutil.wait_procs(kids, timeout=5)
        assert not any(k.is_running() and k.status() != psutil.STATUS_ZOMBIE for k in kids)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_worker_gets_its_own_metrics_directory_never_an_inherited_one(tmp_path):
    inherited = {"PATH": "/bin", "PROMETHEUS_MULTIPROC_DIR": "/run/gunicorn-metrics"}
    off = worker_environment(Settings(worker_metrics_port=0), inherited)
    assert off == {"PATH": "/bin"}
    on = worker_environment(Settings(worker_metrics_port=9102, worker_metrics_dir=tmp_path), inherited)
    assert on == {"PATH": "/bin", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "9102")}
