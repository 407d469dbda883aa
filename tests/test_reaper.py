"""The reaper (tasks.maintenance): no job stays queued or running forever, through a real worker."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from app.idempotency import scoped_key
from models import IdempotencyKey, Job, JobStatus
from models.base import utcnow
from models.db import transaction
from models.tenant import DEFAULT_TENANT_ID
from tasks.config import celery_config
from tasks.contract import names
from tasks.maintenance import reap
from tasks.runtime import runtime
from tests.support.jobs import broker_idle, create_job, event_rows, events, get, wait_done
from tests.support.procs import ROOT, Worker, wait_for, worker_env
from tests.support.workers import metric, thread_workers


def _later(settings, seconds: float):
    return utcnow() + timedelta(seconds=seconds)


def _set(sessions, jid, **values) -> None:
    with transaction(sessions) as s:
        s.execute(update(Job).where(Job.id == jid).values(**values))


def test_a_committed_but_unpublished_job_is_published(settings, sessions, broker):
    with thread_workers(settings) as app:
        jid = create_job(sessions)
        assert reap(runtime(app), app) == {}  # inside the grace period: the API may still publish it
        counts = reap(runtime(app), app, now=_later(settings, settings.publish_grace_s + 1))
        assert counts == {"requeued_unpublished": 1}
        job = wait_done(sessions, jid)
    assert job.status == "succeeded" and job.recoveries == 1 and job.published_at is not None
    [rec] = event_rows(sessions, jid, "job.recovered")
    assert rec.data == {"reason": "unpublished", "stage": "text", "recovery": 1}


def test_a_running_stage_past_its_deadline_is_run_again(settings, sessions, broker):
    """The video stage's worker vanished with its message: the reaper re-enqueues that stage."""
    jid = create_job(sessions)
    _set(
        sessions, jid, status=JobStatus.RUNNING, stage="video", output_text="Shot: a red fox",
        attempts=1, deadline_at=utcnow() - timedelta(seconds=1), published_at=utcnow(),
    )  # fmt: skip
    with thread_workers(settings) as app:
        assert reap(runtime(app), app) == {"requeued_overdue": 1}
        job = wait_done(sessions, jid)
    assert (job.status, job.attempts, job.recoveries) == ("succeeded", 2, 1)
    assert events(sessions, jid) == ["job.recovered", "job.succeeded"]


def test_out_of_recoveries_the_job_fails_with_a_clear_error(settings, sessions, broker):
    jid = create_job(sessions)
    _set(
        sessions, jid, status=JobStatus.RUNNING, stage="text", recoveries=settings.max_recoveries,
        deadline_at=utcnow() - timedelta(seconds=1), published_at=utcnow(),
    )  # fmt: skip
    with thread_workers(settings) as app:
        assert reap(runtime(app), app) == {"failed": 1}
        assert reap(runtime(app), app) == {}  # nothing left to do
        assert broker_idle(broker)  # nothing was published
    job = get(sessions, jid)
    assert (job.status, job.error_code, job.error_stage) == ("failed", "stage_timeout", "text")
    assert "did not finish before its deadline" in job.error_message
    assert events(sessions, jid) == ["job.failed", "job.compensated"]


def test_a_job_queued_too_long_is_published_again(settings, sessions, broker):
    jid = create_job(sessions)
    _set(sessions, jid, published_at=utcnow() - timedelta(seconds=settings.queued_timeout_s + 1))
    with thread_workers(settings) as app:
        assert reap(runtime(app), app) == {"requeued_stale_queued": 1}
        job = wait_done(sessions, jid)
    assert (job.status, job.recoveries) == ("succeeded", 1)
    [rec] = event_rows(sessions, jid, "job.recovered")
    assert rec.data == {"reason": "stale_queued", "stage": "text", "recovery": 1}
    assert events(sessions, jid).count("job.succeeded") == 1


# Out of recoveries, each waiting-job rule fails the job with its own code and reason, and
# publishes nothing. (published_at, seconds past `now`, error code, words of the message)
GIVE_UP = {
    "not_published": (None, "publish_grace_s", "not_published", "could not be handed to the queue"),
    "queue_timeout": ("queued_timeout_s", 0, "queue_timeout", "no worker took the job"),
    "message_lost": ("lost_message_after_s", 0, "message_lost", "text stage's queue message was lost"),
}


@pytest.mark.parametrize("case", list(GIVE_UP))
def test_out_of_recoveries_a_waiting_job_fails_with_its_reason(settings, sessions, broker, case):
    waited, ahead, code, words = GIVE_UP[case]
    jid = create_job(sessions)
    published = None if waited is None else utcnow() - timedelta(seconds=getattr(settings, waited) + 1)
    _set(sessions, jid, published_at=published, recoveries=settings.max_recoveries)
    from tasks.celery_app import create_celery

    app = create_celery(settings, set_as_current=False)
    now = _later(settings, getattr(settings, ahead) + 1 if ahead else 0)
    assert reap(runtime(app), app, now=now) == {"failed": 1}
    assert reap(runtime(app), app, now=now) == {}
    assert broker_idle(broker)  # nothing was published
    job = get(sessions, jid)
    assert (job.status, job.error_code, job.error_stage) == ("failed", code, "text")
    assert words in job.error_message and f"({settings.max_recoveries} recoveries tried)" in job.error_message
    assert events(sessions, jid) == ["job.failed", "job.compensated"]


def test_a_failed_job_left_uncompensated_is_compensated(settings, sessions, broker):
    jid = create_job(sessions)
    folder = Path(settings.artifact_dir) / str(jid)
    folder.mkdir(parents=True)
    (folder / "video.mp4.tmp-abc").write_bytes(b"partial")
    _set(sessions, jid, status=JobStatus.CANCELED, completed_at=utcnow() - timedelta(hours=1))
    with thread_workers(settings) as app:
        assert reap(runtime(app), app) == {"compensated": 1}
        assert reap(runtime(app), app) == {}
    assert not folder.exists()


def test_expired_idempotency_keys_are_deleted(settings, sessions, client):
    client.post("/v1/jobs", json={"prompt": "a", "modality": "text"}, headers={"Idempotency-Key": "old"})
    client.post("/v1/jobs", json={"prompt": "b", "modality": "text"}, headers={"Idempotency-Key": "new"})
    with transaction(sessions) as s:
        old = scoped_key(DEFAULT_TENANT_ID, "old")
        s.execute(update(IdempotencyKey).where(IdempotencyKey.key == old).values(expires_at=utcnow()))
    from tasks.celery_app import create_celery

    app = create_celery(settings, set_as_current=False)
    assert reap(runtime(app), app, now=utcnow() + timedelta(seconds=1))["keys_expired"] == 1
    with sessions() as s:
        assert s.scalars(select(IdempotencyKey.key)).all() == [scoped_key(DEFAULT_TENANT_ID, "new")]
        assert s.scalar(select(func.count()).select_from(Job)) == 2  # the jobs stay


def test_the_reaper_is_scheduled_and_runs_as_a_task(settings, sessions, broker):
    conf = celery_config(settings)
    [entry] = [e for e in conf["beat_schedule"].values() if e["task"] == names.REAP_STUCK_JOBS]
    assert entry["schedule"] == settings.reaper_interval_s
    assert re.search(r"^beat: celery -A tasks.worker .*beat", (ROOT / "Procfile").read_text(), re.M)
    jid = create_job(sessions)

    def requeued() -> float:
        return metric("genqueue_reaper_actions_total", action="requeued_unpublished")

    before = requeued()
    with thread_workers(settings, publish_grace_s=0) as app:
        app.send_task(names.REAP_STUCK_JOBS)
        assert wait_done(sessions, jid).status == "succeeded"
        # Counted as the task returns, after it published the job.
        wait_for(lambda: requeued() == before + 1)


@pytest.mark.slow
def test_celery_beat_drives_the_reaper(settings, sessions, broker, tmp_path):
    """The Procfile's beat process + a worker: an unpublished job gets run without anyone asking."""
    env = worker_env(settings, GENQUEUE_REAPER_INTERVAL_S="1", GENQUEUE_PUBLISH_GRACE_S="0")
    worker = Worker(env, "text,video,default", tmp_path, "all", pool="threads", concurrency=2).start()
    cmd = [sys.executable, "-m", "celery", "-A", "tasks.worker", "beat", "-l", "INFO",
           "--schedule", str(tmp_path / "beat-schedule")]  # fmt: skip
    beat = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        jid = create_job(sessions)
        assert wait_done(sessions, jid, timeout=120).status == "succeeded"
        assert get(sessions, jid).recoveries == 1
    finally:
        beat.terminate()
        beat.wait(30)
        worker.stop()
    wait_for(lambda: broker_idle(broker), 30)


def test_a_failed_republish_is_undone_and_tried_next_run(settings, sessions, broker):
    from tasks.celery_app import create_celery

    jid = create_job(sessions)
    dead = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    down = create_celery(dead, set_as_current=False)
    later = _later(settings, settings.publish_grace_s + 1)
    assert reap(runtime(down), down, now=later) == {"publish_failed": 1}
    job = get(sessions, jid)
    assert (job.recoveries, job.published_at, job.deadline_at) == (0, None, None)
    assert events(sessions, jid) == []
