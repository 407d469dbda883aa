"""A generate() call that never returns, in a threads worker (tasks/hang_guard.py).

The job stops waiting at its soft limit and fails with `timeout`; at the hard limit the process
ends itself (cold shutdown), supervision starts a fresh one, and that one serves the next job.
Without the guard the stuck call holds the model's batcher for good and every later job of the
process times out.
"""

from __future__ import annotations

import threading
import time

import pytest

from tasks import hang_guard
from tests.support.jobs import get, submit, wait_done
from tests.support.procs import Worker, wait_for, worker_env

GEN = "tests.support.generators"


@pytest.mark.slow
def test_a_hung_generate_ends_the_threads_worker_and_a_fresh_one_serves_the_next_job(
    settings, sessions, broker, tmp_path
):
    hung = settings.model_copy(update={"text_model": f"{GEN}:HangingText"})
    env = worker_env(
        hung,
        GENQUEUE_TEXT_SOFT_TIME_LIMIT_S="2",
        GENQUEUE_TEXT_TIME_LIMIT_S="4",
        GENQUEUE_WORKER_RESTART_BACKOFF_S="0.5",
    )
    worker = Worker(env, "text,default", tmp_path, "text", "threads", 4, supervised=True).start()
    try:
        from tasks.celery_app import create_celery

        app = create_celery(hung, set_as_current=False)
        [first_child] = worker.pool_children()
        stuck = submit(sessions, app, "text", "a fox that never finishes [[hang]]")
        job = wait_done(sessions, stuck, timeout=60)
        assert (job.status, job.error_code, job.error_stage) == ("failed", "timeout", "text")

        wait_for(lambda: worker.restarts() >= 1, 60, 0.2, f"the supervisor's restart ({worker.log})")
        text = worker.log_text()
        assert "still running after its hard time limit (4 s)" in text, text[-3000:]
        assert "worker exited with status 1" in text, text[-3000:]  # Celery's cold shutdown, not os._exit
        wait_for(lambda: worker.alive() and " ready." in worker.log_text().split("restart 1")[-1], 90, 0.2,
                 "the fresh worker")  # fmt: skip
        assert [p.pid for p in worker.pool_children()] != [first_child.pid]

        nxt = submit(sessions, app, "text", "a calm fox")
        assert wait_done(sessions, nxt, timeout=60).status == "succeeded"
        assert get(sessions, stuck).status == "failed"  # the hung job is not run again
        assert worker.restarts() == 1
    finally:
        worker.stop()


def test_an_unarmed_guard_lets_a_long_call_run_and_forgets_it(monkeypatch):
    """In-process workers (the demo, the suite's thread workers) never arm it: a call past its
    limit is left alone, and the call's entry goes when it ends."""
    ended: list[int] = []
    monkeypatch.setattr(hang_guard, "_end_process", lambda what, limit: ended.append(1))
    assert not hang_guard.armed()
    with hang_guard.guarded("text:slow", 0.05):
        time.sleep(0.15)
    assert ended == [] and hang_guard._calls == {}


def test_an_armed_guard_fires_once_for_a_call_past_its_limit_and_not_for_one_inside(monkeypatch):
    fired = threading.Event()
    seen: list[tuple[str, float]] = []

    def end(what: str, limit: float) -> None:
        seen.append((what, limit))
        fired.set()

    monkeypatch.setattr(hang_guard, "_end_process", end)
    monkeypatch.setattr(hang_guard, "_thread", None)
    hang_guard.arm()
    with hang_guard.guarded("video:quick", 5.0):
        time.sleep(0.05)  # returns well inside its limit
    with hang_guard.guarded("text:stuck", 0.2):
        assert fired.wait(5), "the guard did not fire"
    assert seen == [("text:stuck", 0.2)]
    assert hang_guard._calls == {}
