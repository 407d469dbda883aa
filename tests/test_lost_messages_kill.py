"""Real SIGKILLs of a Redis worker that lose messages; the reaper (driven by celery beat) must
republish each lost one within lost_message_after_s + reaper_interval_s, and every job must
finish exactly once.

The window between kombu's BRPOP and its `unacked` write is microseconds wide, so the first test
holds the worker inside it (tests/support/fetchtrap, a sitecustomize hook) and kills it there;
the second kills workers at random moments around publishes, as the adversarial round did.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from models import states
from models.db import transaction
from tasks import inflight
from tasks.celery_app import create_celery
from tasks.contract import names
from tasks.contract.publish import publish_job
from tests.support.jobs import create_job, event_rows, events, get, wait_done, wait_until
from tests.support.procs import ROOT, Worker, wait_for, worker_env

BOUND_S, INTERVAL_S = 4, 1  # lost_message_after_s and reaper_interval_s for these runs
SLACK_S = 5  # the reaper's own latency on a loaded machine: beat -> default worker -> Postgres
TRAP_DIR = Path(__file__).parent / "support" / "fetchtrap"


@pytest.fixture
def stack(settings, sessions, broker, tmp_path) -> Iterator:
    """beat + a default-queue worker running the reaper every INTERVAL_S; returns the env for
    the killable text/video workers."""
    env = worker_env(
        settings,
        GENQUEUE_REAPER_INTERVAL_S=str(INTERVAL_S),
        GENQUEUE_LOST_MESSAGE_AFTER_S=str(BOUND_S),
        # a job killed mid-stage comes back after its deadline: hard limit + grace
        GENQUEUE_TEXT_SOFT_TIME_LIMIT_S="3", GENQUEUE_TEXT_TIME_LIMIT_S="4",
        GENQUEUE_VIDEO_SOFT_TIME_LIMIT_S="3", GENQUEUE_VIDEO_TIME_LIMIT_S="4",
        GENQUEUE_STAGE_GRACE_S="2",
        # ten kills in a minute can hit one job more often than production's budgets allow
        GENQUEUE_MAX_RECOVERIES="10", GENQUEUE_MAX_STAGE_ATTEMPTS="12",
    )  # fmt: skip
    reaper = Worker(env, names.DEFAULT_QUEUE, tmp_path, "reaper", pool="threads", concurrency=2).start()
    cmd = [sys.executable, "-m", "celery", "-A", "tasks.worker", "beat", "-l", "INFO",
           "--schedule", str(tmp_path / "beat-schedule")]  # fmt: skip
    with open(tmp_path / "beat.log", "ab") as log:
        beat = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    workers: list[Worker] = []

    def gpu_worker(**extra: str) -> Worker:
        w = Worker(env | extra, "text,video", tmp_path, "gpu", pool="threads", concurrency=2)
        workers.append(w.start())
        return w

    try:
        yield gpu_worker
    finally:
        for w in workers:
            w.stop()
        beat.terminate()
        beat.wait(30)
        reaper.stop()


def _publish(sessions, app, modality: str) -> tuple[uuid.UUID, float]:
    jid = create_job(sessions, modality)
    publish_job(app, jid, modality, "normal")
    with transaction(sessions) as s:
        states.mark_published(s, jid)
    return jid, time.time()


def _taken(trap: Path, task_id: str) -> bool:
    hit = Path(f"{trap}.hit")
    return hit.exists() and task_id in hit.read_text()


def _assert_once(sessions, jid: uuid.UUID, timeout: float, entered_once: bool = True) -> None:
    job = wait_done(sessions, jid, timeout=timeout)
    assert job.status == "succeeded", (jid, job.error_code, job.error_message)
    done = [e for e in events(sessions, jid) if e != "job.recovered"]
    assert done == ["job.started", "job.text.completed", "job.succeeded"], (jid, done)
    if entered_once:  # the last stage was entered once: the redundant message ran nothing
        assert job.attempts == 1


@pytest.mark.slow
def test_a_worker_killed_between_taking_and_recording_a_message(settings, sessions, broker, tmp_path, stack):
    app = create_celery(settings, set_as_current=False)
    trap = tmp_path / "trap"
    hooked = {"PYTHONPATH": f"{ROOT}{os.pathsep}{TRAP_DIR}", "GENQUEUE_TEST_FETCH_TRAP": str(trap)}
    # Each stage's message lost in turn, twice: a text job, a video job's text and video stages.
    rounds = [("text", "text"), ("video", "text"), ("video", "video")] * 2
    worst = 0.0
    worker = stack(**hooked)
    for modality, stage in rounds:
        jid = create_job(sessions, modality)
        task_id = names.stage_task_id(str(jid), stage)
        trap.write_text(task_id)  # before the publish, or the worker could take it first
        publish_job(app, jid, modality, "normal")
        with transaction(sessions) as s:
            states.mark_published(s, jid)
        sent = time.time()
        wait_for(lambda t=task_id: _taken(trap, t), 60, what=f"{task_id} taken")
        worker.kill()  # SIGKILL: after BRPOP, before the unacked write
        trap.write_text("")  # its republished message must not be caught again
        queue = names.TEXT_QUEUE if stage == "text" else names.VIDEO_QUEUE
        assert inflight.live_task_ids(app, queue, [task_id]) == set()  # gone: no list, not unacked
        if stage == "video":
            sent = get(sessions, jid).text_completed_at.timestamp()  # when its video message went
        worker = stack(**hooked)  # the next round's worker runs the republished message
        wait_until(sessions, jid, lambda j: j.recoveries >= 1, BOUND_S + INTERVAL_S + 60, "recovered")
        _assert_once(sessions, jid, 60)
        [rec] = event_rows(sessions, jid, "job.recovered")
        assert rec.data["reason"] == "lost_message" and rec.data["stage"] == stage
        late = rec.created_at.timestamp() - sent
        worst = max(worst, late)
        assert late <= BOUND_S + INTERVAL_S + SLACK_S, (jid, stage, late)
    print(f"lost messages republished <= {worst:.1f} s after they were sent (bound {BOUND_S}+{INTERVAL_S} s)")


@pytest.mark.slow
def test_random_sigkills_around_publishes(settings, sessions, broker, stack):
    """Kill the worker 0-40 ms after a publish, ten times: whatever each kill hit (nothing, a
    taken message, a reserved one, a running stage), every job finishes exactly once."""
    app = create_celery(settings, set_as_current=False)
    rng = random.Random(13)
    jobs: list[uuid.UUID] = []
    started = time.monotonic()
    for _ in range(10):
        worker = stack()
        for modality in ("text", "video"):
            jobs.append(_publish(sessions, app, modality)[0])
        time.sleep(rng.uniform(0, 0.04))  # the kill's moment, not a synchronisation
        worker.kill()
    stack()
    for jid in jobs:
        _assert_once(sessions, jid, 180, entered_once=False)  # a stage killed mid-run ran twice
    recovered = [r.data["reason"] for jid in jobs for r in event_rows(sessions, jid, "job.recovered")]
    took = time.monotonic() - started
    print(f"{len(jobs)} jobs, 10 kills, all done once in {took:.0f} s; recoveries {recovered}")
