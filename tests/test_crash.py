"""Crash safety with real worker processes: SIGKILL mid-task, duplicated messages, a poison job.

Each stage is idempotent (fixed task id, conditional transitions, temp name + rename), so
redelivery after a kill or a duplicated message gives one artifact, one `succeeded`
transition and one completion event.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from models import states
from models.db import transaction
from tests.support.generators import runs
from tests.support.jobs import broker_idle, event_rows, events, files, get, submit, wait_done
from tests.support.jobs import wait_until as wait_job
from tests.support.procs import RabbitVhost, Worker, rabbitmq_available, wait_for, worker_env
from tests.support.workers import thread_workers

GEN = "tests.support.generators"
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


@pytest.mark.slow
def test_sigkill_of_a_supervised_threads_video_worker_puts_its_messages_back_at_once_redis(
    settings, sessions, broker, spawn, tmp_path
):
    """The Procfile's video worker (threads -c 2, under `genqueue worker`) killed outright: its
    supervisor puts the two messages it held back before the restart (tasks/held_messages.py),
    not after the 2 h visibility timeout, and both jobs finish once."""
    assert settings.broker_visibility_timeout_s >= 3600  # nothing else would bring them back in time
    spawn(settings, "text,default", pool="threads", concurrency=2)
    held_dir = tmp_path / "held"
    env = worker_env(
        settings,
        GENQUEUE_ECHO_STEP_SECONDS=STEP_S,
        GENQUEUE_WORKER_HELD_DIR=str(held_dir),
        GENQUEUE_WORKER_RESTART_BACKOFF_S="0.5",
    )
    video = Worker(env, "video", tmp_path, "video", "threads", 2, supervised=True).start()
    try:
        from tasks.celery_app import create_celery

        app = create_celery(settings, set_as_current=False)
        longer = {"steps": 30}  # ~9 s each: both still held when the kill comes, on a loaded machine too
        jids = [submit(sessions, app, **longer), submit(sessions, app, **longer)]
        [celery] = video.pool_children()
        held = held_dir / str(celery.pid)
        wait_for(lambda: len(list(held.iterdir())) == 2, 60, what=f"two held tags in {held}")
        # One renders, the other waits for the model: kill in the middle of the render.
        wait_for(lambda: any(get(sessions, i).progress > 30 for i in jids), 60, what="the render half done")
        rendering = [i for i in jids if get(sessions, i).progress > 30]
        assert len(list(held.iterdir())) == 2
        celery.send_signal(signal.SIGKILL)  # no ack, no restore: only the supervisor can help
        wait_for(lambda: video.restarts() >= 1, 30, 0.2, "the supervisor's restart")
        for jid in jids:
            job = wait_done(sessions, jid, timeout=120)
            assert job.status == "succeeded", (job.error_code, job.error_message)
            assert events(sessions, jid) == ["job.started", "job.text.completed", "job.succeeded"]
            assert files(settings.artifact_dir, jid) == ["thumbnail.jpg", "video.mp4"]
            # The killed render and the one after the restart; once more would be a duplicate.
            assert job.attempts == 2 if jid in rendering else job.attempts <= 2, job.attempts
        assert "held 2 message(s): put back in their queues" in video.log_text()
        assert not held.exists()
        wait_for(lambda: broker_idle(broker), 30, what="no message left behind")
    finally:
        video.stop()
    assert list(held_dir.iterdir()) == []  # a warm stop leaves no folder behind


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


def _paused_at(folder: Path, jid: uuid.UUID, point: str) -> int:
    """The pid of the process PausingVideo stopped at `point` for this job."""
    marker = folder / f"{jid}.{point}"
    wait_for(lambda: marker.exists() and marker.read_text(), 120, what=f"the video stage to pause: {point}")
    return int(marker.read_text())


def _temp_files(settings, jid: uuid.UUID) -> list[str]:
    return [f for f in files(settings.artifact_dir, jid) if ".tmp-" in f]


@pytest.mark.slow
def test_sigkill_mid_write_and_after_the_commit_leaves_one_artifact_and_no_temp_files(
    settings, sessions, broker, spawn, tmp_path
):
    """Kill the pool child with the MP4 half-published (temp file, no rename), then the next one
    after it committed the success but before the sweep and the ack: the third delivery finds
    the job done. One artifact, one completion, and the first attempt's temp file swept."""
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    paused = settings.model_copy(update={"video_model": f"{GEN}:PausingVideo"})
    spawn(paused, "text,default", pool="threads", concurrency=2)
    video = spawn(paused, "video", GENQUEUE_TEST_PAUSE_DIR=str(pauses))
    from tasks.celery_app import create_celery

    app = create_celery(paused, set_as_current=False)
    jid = submit(sessions, app)
    pid = _paused_at(pauses, jid, "written")
    assert _temp_files(settings, jid) and get(sessions, jid).status == "running"
    os.kill(pid, signal.SIGKILL)  # reject_on_worker_lost: the message goes back
    pid = _paused_at(pauses, jid, "committed")
    assert get(sessions, jid).status == "succeeded"
    assert _temp_files(settings, jid), "the killed attempt's temp file is still there"
    os.kill(pid, signal.SIGKILL)  # committed, not acked: delivered a third time
    # The third delivery runs to its ack (the killed ones never log a result).
    wait_for(lambda: f"[{jid}.video] succeeded" in video.log_text(), 120, what="the third delivery")
    wait_for(lambda: broker_idle(broker), 30, what="no message left behind")
    _assert_completed_once(settings, sessions, jid)
    assert len(event_rows(sessions, jid, "job.succeeded")) == 1
    assert get(sessions, jid).artifact_path == f"{jid}/video.mp4"


@contextmanager
def _video_tasks_ended(jid: uuid.UUID) -> Iterator[list[str]]:
    """Task ids of the generate_video executions that ended in this process (any outcome)."""
    from celery.signals import task_postrun

    ended: list[str] = []

    def record(task_id: str | None = None, **_: object) -> None:
        if task_id == f"{jid}.video":
            ended.append(task_id)

    task_postrun.connect(record, weak=False)
    try:
        yield ended
    finally:
        task_postrun.disconnect(record)


def test_a_duplicated_video_message_makes_one_artifact_and_one_completion(
    settings, sessions, broker, monkeypatch
):
    """Copies of the video message (a crash before the ack, the reaper) arrive while the video
    stage runs and after it finished: the one during the run re-enters the stage (counted as an
    attempt; the stage may run twice, its effects happen once), the later ones do nothing."""
    from tasks.celery_app import create_celery
    from tasks.contract.publish import publish_job

    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.2")  # 20 steps: ~4 s of video stage
    tag = f"dup-{uuid.uuid4().hex[:8]}"
    app = create_celery(settings, set_as_current=False)
    jid = submit(sessions, app, prompt=f"a red fox {tag}", steps=20)
    with thread_workers(settings, video_model=f"{GEN}:TracedVideo"), _video_tasks_ended(jid) as ended:
        wait_for(lambda: any(r.steps >= 2 for r in runs(tag)), 60, what="the video stage to run")
        publish_job(app, jid, "video", "normal", stage="video")  # a copy while it runs...
        wait_job(sessions, jid, lambda j: j.attempts == 2, 30, "the copy to re-enter the running stage")
        job = wait_done(sessions, jid)
        ran = len(runs(tag))
        publish_job(app, jid, "video", "normal")  # ...the whole chain again after it finished...
        publish_job(app, jid, "video", "normal", stage="video")  # ...and the video stage once more
        wait_for(lambda: len(ended) == 4, 60, what="every video message to be consumed")
        wait_for(lambda: broker_idle(broker), 30, what="every copy to be acked")
    assert job.status == "succeeded"
    assert events(sessions, jid) == ["job.started", "job.text.completed", "job.succeeded"]
    assert get(sessions, jid).attempts == 2  # the copies after the end never entered the stage
    assert len(runs(tag)) == ran <= 2  # and never ran the model
    # The copy that re-entered the running stage either never reached the model (dropped from
    # the batch once the job had succeeded) or was stopped there by the job's success.
    assert [r.outcome for r in runs(tag)] in (["finished"], ["finished", "Canceled"])
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


@pytest.mark.slow
def test_a_cancel_the_adapter_misses_leaves_no_files_once_the_stage_ends(settings, sessions, broker, spawn):
    """A prefork render that cannot see the cancel writes its MP4 anyway; the stage's final
    transition then finds the job canceled and removes those late files itself (its `overtaken`
    outcome). The job is canceled in the database only, so no compensate message tidies up."""
    deaf = settings.model_copy(update={"video_model": f"{GEN}:DeafVideo"})
    spawn(deaf, "text,default", pool="threads", concurrency=2)
    spawn(deaf, "video", GENQUEUE_ECHO_STEP_SECONDS=STEP_S)
    from tasks.celery_app import create_celery

    app = create_celery(deaf, set_as_current=False)
    jid = submit(sessions, app, **LONG)
    _mid_video(sessions, jid)
    with transaction(sessions) as s:
        assert states.cancel(s, jid)
    wait_for(lambda: "job.compensated" in events(sessions, jid), 60, what="the stage's compensation")
    job = get(sessions, jid)
    assert job.status == "canceled" and job.artifact_path is None
    assert files(settings.artifact_dir, jid) == []
    assert len(event_rows(sessions, jid, "job.compensated")) == 1
