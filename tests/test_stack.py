"""`genqueue start` (app.stack) on small shell processes: restarts, clean exits that stay down, the stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from app.stack import exec_form, read_procfile
from tests.support.procs import ROOT, wait_for

# A process that takes a second to stop after SIGTERM: its shell dies at once, it must be waited for.
SLOW_STOP = (
    f'{sys.executable} -c "import signal, sys, time; '
    "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1), print('drained', flush=True), sys.exit(0))); "
    "print('serving', flush=True); [time.sleep(0.1) for _ in iter(int, 1)]\""
)


def _start(tmp_path: Path, procfile: str, *names: str, **env: str) -> tuple[subprocess.Popen[bytes], Path]:
    path = tmp_path / "Procfile"
    path.write_text(procfile)
    log = tmp_path / "stack.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GENQUEUE_")}
    environ |= {"PYTHONPATH": str(ROOT), "GENQUEUE_WORKER_RESTART_BACKOFF_S": "0.1", **env}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "start", "--procfile", str(path), *names],
            cwd=tmp_path, env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    return proc, log


def _lines(log: Path) -> list[str]:
    """The processes' output lines, without the time and the name."""
    return [ln[ln.index("| ") :].rstrip() for ln in log.read_text().splitlines() if "| " in ln]


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, float, list[psutil.Process]]:
    family = psutil.Process(proc.pid).children(recursive=True)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    _, alive = psutil.wait_procs(family, timeout=5)
    return rc, time.monotonic() - started, [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "gunicorn -c ops/gunicorn.conf.py 'app:create_app()'",
            "exec gunicorn -c ops/gunicorn.conf.py 'app:create_app()'",
        ),
        ("A=text B='x y' genqueue worker -n a@%h", "A=text B='x y' exec genqueue worker -n a@%h"),
        ("celery flower --port=${FLOWER_PORT:-5555}", "exec celery flower --port=${FLOWER_PORT:-5555}"),
        ("mkdir -p var && celery beat", "mkdir -p var && celery beat"),
        ("a | b", "a | b"),
        ("echo $(date)", "echo $(date)"),
    ],
)
def test_simple_lines_exec_their_command_and_shell_syntax_is_left_alone(line: str, expected: str) -> None:
    assert exec_form(line) == expected


def test_assignments_before_exec_reach_the_command() -> None:
    out = subprocess.run(["/bin/sh", "-c", exec_form("A=1 B='x y' env")], capture_output=True, text=True)
    assert "A=1" in out.stdout.splitlines() and "B=x y" in out.stdout.splitlines()


def test_procfile_lines_are_read_in_order() -> None:
    assert list(read_procfile(ROOT / "Procfile"))[:2] == ["release", "web"]
    assert "flower" in read_procfile(ROOT / "Procfile")


def test_release_runs_first_a_crash_is_restarted_a_clean_exit_stays_down_and_stop_waits(tmp_path) -> None:
    mark = tmp_path / "crashed-once"
    proc, log = _start(
        tmp_path,
        f"release: echo migrated > {tmp_path}/released\n"
        "once: echo once-done\n"
        f"flaky: if [ -e {mark} ]; then echo second-run; exec sleep 60; else touch {mark}; exit 3; fi\n"
        f"slow: {SLOW_STOP}\n",
    )
    try:
        # Output lines, not the logged commands that contain the same words.
        wait_for(lambda: {"| second-run", "| serving"} <= set(_lines(log)), 30, 0.1, "flaky's rerun")
        text = log.read_text()
        assert (tmp_path / "released").read_text() == "migrated\n"
        assert "flaky exited with status 3; restart 1" in text  # the crash is visible and restarted
        wait_for(lambda: "once exited with status 0 and stays down" in log.read_text(), 10, 0.1, "once")
        assert proc.poll() is None  # one clean exit stopped nothing
    finally:
        rc, took, orphans = _stop(proc, 30)
    text = log.read_text()
    assert rc == 0, text
    # It waited for the slow process, not only for its shell.
    assert "| drained" in _lines(log) and 1 <= took < 10, (took, text)
    assert not orphans, orphans


def test_a_process_that_ignores_sigterm_gets_sigquit_after_the_stop_timeout(tmp_path) -> None:
    proc, log = _start(
        tmp_path,
        "stubborn: trap '' TERM; echo up; sleep 60\n",
        GENQUEUE_STOP_TIMEOUT_S="1",
    )
    try:
        wait_for(lambda: "| up" in _lines(log), 30, 0.1, "stubborn to start")
    finally:
        rc, took, orphans = _stop(proc, 30)
    text = log.read_text()
    assert rc == 1 and "stubborn still running: SIGQUIT" in text, text
    # Without the SIGQUIT the stop would wait out the 60 s sleep; the bound is loose for a loaded machine.
    assert took < 20 and not orphans


def test_start_refuses_an_unauthenticated_flower_before_migrating(tmp_path) -> None:
    proc, log = _start(tmp_path, f"release: touch {tmp_path}/released\nflower: genqueue flower\n")
    assert proc.wait(timeout=30) == 1
    assert "GENQUEUE_FLOWER_BASIC_AUTH" in log.read_text()
    assert not (tmp_path / "released").exists()


def test_named_processes_run_alone_and_release_only_when_named(tmp_path) -> None:
    procfile = f"release: touch {tmp_path}/released\nweb: echo web-ran\nworker: echo worker-ran\n"
    proc, log = _start(tmp_path, procfile, "worker")
    assert proc.wait(timeout=30) == 0  # its only process exited 0: nothing left to run
    assert "| worker-ran" in _lines(log) and "web-ran" not in log.read_text()
    assert not (tmp_path / "released").exists()
    proc, log = _start(tmp_path, procfile, "nosuch")
    assert proc.wait(timeout=30) == 1 and "nosuch" in log.read_text()


def test_a_sigkilled_stack_still_stops_its_processes(tmp_path) -> None:
    child = tmp_path / "child.py"
    child.write_text(
        "import signal, sys, time\n"
        "from pathlib import Path\n"
        f"mark = Path({str(tmp_path / 'termed')!r})\n"
        "signal.signal(signal.SIGTERM, lambda *a: (mark.touch(), sys.exit(0)))\n"
        "print('up', flush=True)\n"
        "while True:\n"
        "    time.sleep(0.1)\n"
    )
    proc, log = _start(tmp_path, f"child: {sys.executable} {child}\n")
    try:
        wait_for(lambda: "| up" in _lines(log), 30, 0.1, "the child to start")
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) == 1  # `exec`: the shell became the process
        os.kill(proc.pid, signal.SIGKILL)
        wait_for((tmp_path / "termed").exists, 10, 0.1, "the parent-death SIGTERM")
        psutil.wait_procs(family, timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
