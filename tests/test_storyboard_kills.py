"""Storyboards survive killed video workers: mid-shot and mid-stitch, with real worker processes."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator

import pytest

from models import shot_states
from tasks.contract import names
from tests.support.jobs import event_rows, events, files, submit, wait_done, wait_until
from tests.support.procs import Worker, wait_for, worker_env

GEN = "tests.support.generators"
BOARD = {"shots": 2, "width": 64, "height": 64, "num_frames": 5, "fps": 6, "steps": 8, "seed": 3,
         "enhance_prompt": False}  # fmt: skip
PROMPT = "A keeper climbs the stairs. He lights the lamp."


@pytest.fixture
def spawn(tmp_path) -> Iterator:
    started: list[Worker] = []

    def start(settings, queues: str, pool: str = "prefork", concurrency: int = 1, **env) -> Worker:
        w = Worker(worker_env(settings, **env), queues, tmp_path, queues.split(",")[0], pool, concurrency)
        started.append(w.start())
        return w

    yield start
    for w in started:
        w.stop()


def _app(settings):
    from tasks.celery_app import create_celery

    return create_celery(settings, set_as_current=False)


def _assert_one_film(settings, sessions, jid: uuid.UUID) -> None:
    job = wait_done(sessions, jid, timeout=180)
    assert job.status == "succeeded", (job.error_code, job.error_message)
    assert sorted(e.data["shot"] for e in event_rows(sessions, jid, "job.shot.completed")) == [0, 1]
    assert events(sessions, jid).count("job.succeeded") == 1
    expected = ["contact-sheet.jpg", names.shot_name(0), names.shot_name(1), "thumbnail.jpg", "video.mp4"]
    assert sorted(files(settings.artifact_dir, jid)) == sorted(expected)  # no temp leftovers
    assert job.frames_rendered == 2 * BOARD["num_frames"]


@pytest.mark.slow
def test_a_video_worker_killed_mid_shot_renders_that_shot_again(settings, sessions, broker, spawn):
    spawn(settings, "text,default", pool="threads", concurrency=2)
    video = spawn(settings, "video", GENQUEUE_ECHO_STEP_SECONDS="0.3")
    [child] = video.pool_children()
    jid = submit(sessions, _app(settings), "storyboard", PROMPT, **BOARD)

    def mid_shot() -> bool:
        with sessions() as s:
            return any(sh.status == "running" and sh.progress > 30 for sh in shot_states.of_job(s, jid))

    wait_for(mid_shot, 120, what="a shot mid-render")
    child.send_signal(signal.SIGKILL)  # task_reject_on_worker_lost: the shot's message goes back
    _assert_one_film(settings, sessions, jid)
    with sessions() as s:
        attempts = sorted(sh.attempts for sh in shot_states.of_job(s, jid))
    assert attempts == [1, 2]  # the killed shot ran again, the other once


@pytest.mark.slow
def test_a_video_worker_killed_mid_stitch_stitches_again(settings, sessions, broker, spawn, tmp_path):
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    paused = settings.model_copy(update={"video_model": f"{GEN}:PausingStitch"})
    spawn(paused, "text,default", pool="threads", concurrency=2)
    video = spawn(paused, "video", GENQUEUE_TEST_PAUSE_DIR=str(pauses))
    jid = submit(sessions, _app(paused), "storyboard", PROMPT, **BOARD)
    marker = pauses / "storyboard.stitched"
    wait_for(lambda: marker.exists() and marker.read_text(), 120, what="the stitch to pause")
    wait_until(sessions, jid, lambda j: j.stage == "stitch", 10, "the job in its stitch")
    [child] = [p for p in video.pool_children() if p.pid == int(marker.read_text())]
    child.send_signal(signal.SIGKILL)  # the film was written, not stored: the stitch runs again
    _assert_one_film(settings, sessions, jid)
    with sessions() as s:
        from models import Job

        job = s.get(Job, jid)
        assert job is not None and job.attempts == 2  # the killed stitch and the one that finished
