"""Crash safety with real worker processes: SIGKILL mid-task, duplicated messages, a poison job.

Each stage is idempotent (fixed task id, conditional transitions, temp name + rename), so
redelivery after a kill or a duplicated message gives one artifact, one `succeeded`
transition and one completion event.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator

import pytest

from tests.support.jobs import broker_idle, event_rows, events, files, get, submit, thread_workers, wait_done
from tests.support.jobs import wait_until as wait_job
from tests.support.procs import RabbitVhost, Worker, rabbitmq_available, wait_for, worker_env

STEP_S = "0.3"
LONG = {"steps": 12}  # ~3.6 s of video stage: time to kill it in the middle


@pytest.fixture
def spawn(tmp_path) -> Iterator:
    """Start worker subprocesses; all are stopped (or killed) at the end of the test."""
    started: list[Worker] = []

    def start(settings, queues: str, pool: str = "prefork", concurrency: int = 1, **env) -> Worker:
        w = Worker(worker_env(settings, **env), queues, tmp_path, queues.split(",")[0], pool, concurrency)
        started.append(w.start())
        return w

    yield start
    for w in started:
        w.stop()


def _assert_completed_once(settings, sessions, jid: uuid.UUID, attempts: int = 2) -> None:
    job = wait_done(sessions, jid, timeout=180)
    assert job.status == "succeeded", (job.error_code, job.error_message)
    assert events(sessions, jid) == ["job.started", "job.text.completed", "job.succeeded"]
    assert job.attempts == attempts  # the killed run and the one that finished
    assert files(settings.artifact_dir, jid) == ["thumbnail.jpg", "video.mp4"]  # no temp leftovers


def _mid_video(sessions, jid):
    return wait_job(sessions, jid, lambda j: j.stage == "video" and j.progress > 30, 120, "video mid-run")


@pytest.mark.slow
def test_sigkill_of_the_video_pool_child_mid_task(settings, sessions, broker, spawn):
    spawn(settings, "text,default", pool="threads", concurrency=2)
    video = spawn(settings, "video", GENQUEUE_ECHO_STEP_SECONDS=STEP_S)
    [child] = video.pool_children()
    from tasks.celery_app import create_celery

    app = create_celery(settings, set_as_current=False)
    jid = submit(sessions, app, **LONG)
    _mid_video(sessions, jid)
    child.send_signal(signal.SIGKILL)  # task_reject_on_worker_lost: the message goes back
    _assert_completed_once(settings, sessions, jid)
    assert "WorkerLostError" in video.log_text() or "exited" in video.log_text()
    wait_for(lambda: broker_idle(broker), 30, what="no message left behind")


@pytest.mark.slow
def test_sigkill_of_the_whole_video_worker_then_a_new_one_redis(settings, sessions, broker, spawn):
    fast = settings.model_copy(update={"broker_visibility_timeout_s": 10, "broker_restore_interval_s": 1})
    spawn(fast, "text,default", pool="threads", concurrency=2)
    video = spawn(fast, "video", GENQUEUE_ECHO_STEP_SECONDS=STEP_S)
    from tasks.celery_app import create_celery

    app = create_celery(fast, set_as_current=False)
    jid = submit(sessions, app, **LONG)
    _mid_video(sessions, jid)
    video.kill()  # worker and child at once: no ack, no restore at shutdown
    assert get(sessions, jid).status == "running"
    spawn(fast, "video", GENQUEUE_ECHO_STEP_SECONDS=STEP_S)  # restores it after the visibility timeout
    _assert_completed_once(settings, sessions, jid)
    wait_for(lambda: broker_idle(broker), 30, what="no message left behind")


@pytest.fixture
def rabbit() -> Iterator[RabbitVhost]:
    if not rabbitmq_available():
        pytest.skip("RabbitMQ is not running on 127.0.0.1:5672")
    vhost = RabbitVhost().create()
    yield vhost
    vhost.delete()


@pytest.mark.slow
def test_sigkill_of_the_whole_video_worker_then_a_new_one_rabbitmq(settings, sessions, spawn, rabbit):
    amqp = settings.model_copy(update={"broker_url": rabbit.url})
    spawn(amqp, "text,default", pool="threads", concurrency=2)
    video = spawn(amqp, "video", GENQUEUE_ECHO_STEP_SECONDS=STEP_S)
    from tasks.celery_app import create_celery

    app = create_celery(amqp, set_as_current=False)
    jid = submit(sessions, app, **LONG)
    _mid_video(sessions, jid)
    video.kill()  # the broker requeues the unacked message when the connection drops
    spawn(amqp, "video", GENQUEUE_ECHO_STEP_SECONDS=STEP_S)
    _assert_completed_once(settings, sessions, jid)


def test_a_duplicated_video_message_makes_one_artifact_and_one_completion(settings, sessions, broker):
    from tasks.celery_app import create_celery
    from tasks.publish import publish_job

    app = create_celery(settings, set_as_current=False)
    jid = submit(sessions, app)
    publish_job(app, jid, "video", "normal")  # the whole chain twice...
    for _ in range(2):  # ...and the video stage twice more, as a crash before the ack would
        publish_job(app, jid, "video", "normal", stage="video")
    with thread_workers(settings):
        job = wait_done(sessions, jid)
        wait_for(lambda: broker_idle(broker), 30, what="every copy to be consumed")
    assert job.status == "succeeded"
    assert events(sessions, jid) == ["job.started", "job.text.completed", "job.succeeded"]
    assert files(settings.artifact_dir, jid) == ["thumbnail.jpg", "video.mp4"]
    assert get(sessions, jid).artifact_path == f"{jid}/video.mp4"


@pytest.mark.slow
def test_a_poison_job_fails_after_the_maximum_attempts_without_a_redelivery_loop(
    settings, sessions, broker, spawn
):
    """Its video stage kills the pool child every time; each kill requeues it (reject_on_worker_lost)."""
    limited = settings.model_copy(
        update={"max_stage_attempts": 3, "video_model": "tests.support.generators:CrashingVideo"}
    )
    spawn(limited, "text,default", pool="threads", concurrency=2)
    video = spawn(limited, "video")
    from tasks.celery_app import create_celery

    app = create_celery(limited, set_as_current=False)
    jid = submit(sessions, app, prompt="a fox [[crash]]")
    job = wait_done(sessions, jid, timeout=180)
    assert (job.status, job.error_code, job.error_stage) == ("failed", "too_many_attempts", "video")
    assert job.attempts == 4 and "after 3 attempts" in job.error_message
    wait_for(lambda: broker_idle(broker), 60, what="the poison message to be acked")
    assert len(event_rows(sessions, jid, "job.compensated")) == 1
    assert events(sessions, jid)[-2:] == ["job.failed", "job.compensated"]
    # The worker lives on and serves the next job.
    nxt = submit(sessions, app, prompt="a calm fox")
    assert wait_done(sessions, nxt, timeout=120).status == "succeeded"
    assert video.proc is not None and video.proc.poll() is None
    assert get(sessions, jid).attempts == 4  # no more deliveries of the poison job


@pytest.mark.slow
@pytest.mark.parametrize("allowed", [True, False])
def test_soft_time_limit_in_a_prefork_worker_degrades_or_fails_cleanly(
    settings, sessions, broker, spawn, allowed
):
    """A real soft time limit (SIGUSR1 in the pool child): the cheaper retry fits, or the job fails
    with `timeout`; either way the same child then serves the next job."""
    limited = settings.model_copy(
        update={
            "video_model": "tests.support.generators:CostlyVideo",
            "video_soft_time_limit_s": 3,
            "video_time_limit_s": 60,
        }
    )
    spawn(limited, "text,default", pool="threads", concurrency=2)
    video = spawn(limited, "video", GENQUEUE_TEST_PIXEL_STEP_SECONDS="0.1")
    [child] = video.pool_children()
    from tasks.celery_app import create_celery

    app = create_celery(limited, set_as_current=False)
    # 128x128 x 8 steps: 3.2 s of "compute" > 3 s; degraded 64x64 x 4 steps: 0.4 s.
    jid = submit(sessions, app, width=128, height=128, steps=8, allow_degraded=allowed)
    job = wait_done(sessions, jid, timeout=120)
    if allowed:
        assert job.status == "succeeded", (job.error_code, job.error_message)
        assert job.degraded["reason"] == "timeout"
        assert job.degraded["to"] == {"width": 64, "height": 64, "steps": 4, "model": limited.video_model}
    else:
        assert (job.status, job.error_code, job.error_stage) == ("failed", "timeout", "video")
        assert files(settings.artifact_dir, jid) == []
    nxt = submit(sessions, app, width=64, height=64, steps=2)
    assert wait_done(sessions, nxt, timeout=120).status == "succeeded"
    assert video.pool_children() == [child]  # the same pool child, alive
