"""Retries, degraded retries and compensation through a real worker (threads pool) and Redis."""

from __future__ import annotations

import uuid

import av
import pytest
from sqlalchemy import select

from models import Job
from tasks import compensation, failures
from tests.support.jobs import (
    broker_idle,
    event_rows,
    events,
    files,
    submit,
    wait_done,
)
from tests.support.procs import wait_for
from tests.support.workers import metric, thread_workers

GEN = "tests.support.generators"


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    for retries in range(8):
        ceiling = min(10.0, 0.5 * 2**retries)
        samples = {failures.backoff(0.5, 10.0, retries) for _ in range(50)}
        assert all(ceiling / 2 <= x <= ceiling for x in samples)
        assert len(samples) > 1  # jittered


def test_transient_text_error_retries_and_the_video_stage_still_runs_once(settings, sessions, broker):
    with thread_workers(settings, text_model=f"{GEN}:FlakyText") as app:
        jid = submit(sessions, app, prompt=f"a fox [[flaky:2]] {uuid.uuid4().hex}")
        job = wait_done(sessions, jid)
    assert job.status == "succeeded", job.error_message
    assert events(sessions, jid) == [
        "job.started", "job.retrying", "job.retrying", "job.text.completed", "job.succeeded",
    ]  # fmt: skip
    retries = event_rows(sessions, jid, "job.retrying")
    assert [r.data["attempt"] for r in retries] == [1, 2]
    assert all(r.data["code"] == "transient_failure" and r.data["stage"] == "text" for r in retries)
    assert job.attempts == 1  # the video stage ran once
    assert files(settings.artifact_dir, jid) == ["thumbnail.jpg", "video.mp4"]


def test_retries_are_bounded_then_the_job_fails_and_is_compensated_once(settings, sessions, broker):
    with thread_workers(settings) as app:
        jid = submit(sessions, app, prompt="always [[transient]]")
        job = wait_done(sessions, jid)
        assert (job.status, job.error_code, job.error_stage) == ("failed", "transient_failure", "text")
        assert job.attempts == settings.max_retries + 1
        wait_for(lambda: broker_idle(broker), 30, what="the broker to drain")
    assert events(sessions, jid) == [
        "job.started", *["job.retrying"] * settings.max_retries, "job.failed", "job.compensated",
    ]  # fmt: skip


def test_permanent_error_fails_at_once(settings, sessions, broker):
    with thread_workers(settings) as app:
        jid = submit(sessions, app, prompt="poison [[fail]]")
        job = wait_done(sessions, jid)
    assert (job.status, job.error_code, job.attempts) == ("failed", "invalid_request", 1)
    assert events(sessions, jid) == ["job.started", "job.failed", "job.compensated"]


def test_failure_after_a_stage_completed_removes_its_files(settings, sessions, broker, monkeypatch):
    """Video written, then the final transition finds a failed job: nothing is left behind."""
    from tasks import pipeline

    with thread_workers(settings) as app:
        real = pipeline.states.complete_render

        def fail_first(s, jid, *args, **kw):  # the reaper failed the job while it rendered
            pipeline.states.fail(s, jid, "stage_timeout", "too slow", "video")
            return real(s, jid, *args, **kw)

        monkeypatch.setattr(pipeline.states, "complete_render", fail_first)
        jid = submit(sessions, app)
        job = wait_done(sessions, jid)
        wait_for(lambda: "job.compensated" in events(sessions, jid), 30)
    assert (job.status, job.error_code, job.error_stage) == ("failed", "stage_timeout", "video")
    assert files(settings.artifact_dir, jid) == []
    [comp] = event_rows(sessions, jid, "job.compensated")
    assert comp.data["files_removed"] is True and comp.data["stage"] == "video"


def test_compensation_records_and_releases_once_however_often_it_fires(settings, sessions, broker):
    released: list[uuid.UUID] = []

    def release(_s, job: Job) -> str:
        released.append(job.id)
        return "slot released"

    compensation.on_release(release)
    try:
        with thread_workers(settings) as app:
            jid = submit(sessions, app, prompt="poison [[fail]]")
            wait_done(sessions, jid)
            for _ in range(3):  # errbacks may fire more than once
                app.send_task("genqueue.compensate", args=(str(jid),))
            wait_for(lambda: broker_idle(broker), 30, what="the errbacks to run")
    finally:
        compensation.remove_release_hook(release)
    assert released == [jid]
    [comp] = event_rows(sessions, jid, "job.compensated")
    assert comp.data["released"] == ["'slot released'"]


def test_errback_fails_a_job_whose_stage_crashed_unexpectedly(settings, sessions, broker):
    """A stage that dies outside the handled paths (here: its job row has an unreadable params
    value) reaches the errback, which fails the job with an error and compensates."""
    with thread_workers(settings) as app:
        jid = submit(sessions, app, max_new_tokens="many")  # int("many") inside the stage
        job = wait_done(sessions, jid)
        wait_for(lambda: "job.compensated" in events(sessions, jid), 30)
    assert (job.status, job.error_code, job.error_stage) == ("failed", "internal_error", "text")


# --- degrade instead of die ---------------------------------------------------------------------


def _video_size(settings, job: Job) -> tuple[int, int]:
    with av.open(str(settings.artifact_dir / job.artifact_path)) as container:
        stream = container.streams.video[0]
        return stream.width, stream.height


def test_out_of_memory_degrades_once_when_allowed(settings, sessions, broker):
    degraded = metric("genqueue_degradations_total", reason="out_of_memory")
    with thread_workers(settings, video_model=f"{GEN}:SizeLimitedVideo") as app:
        jid = submit(sessions, app, width=128, height=96, steps=4, allow_degraded=True)
        job = wait_done(sessions, jid)
        assert job.status == "succeeded", job.error_message
        assert metric("genqueue_degradations_total", reason="out_of_memory") == degraded + 1
        assert job.degraded == {
            "reason": "out_of_memory",
            "from": {"width": 128, "height": 96, "steps": 4, "model": f"{GEN}:SizeLimitedVideo"},
            "to": {"width": 64, "height": 48, "steps": 2, "model": f"{GEN}:SizeLimitedVideo"},
        }
        assert _video_size(settings, job) == (64, 48)
        assert events(sessions, jid).count("job.degraded") == 1
        # The worker's next task runs normally.
        nxt = submit(sessions, app, width=64, height=48)
        assert wait_done(sessions, nxt).status == "succeeded"


def test_out_of_memory_without_permission_retries_then_fails_cleanly(settings, sessions, broker):
    with thread_workers(settings, video_model=f"{GEN}:SizeLimitedVideo") as app:
        jid = submit(sessions, app, width=128, height=96)
        job = wait_done(sessions, jid)
        assert (job.status, job.error_code, job.error_stage) == ("failed", "out_of_memory", "video")
        assert job.degraded is None and job.attempts == settings.max_retries + 1
        assert files(settings.artifact_dir, jid) == []
        nxt = submit(sessions, app, width=64, height=48)
        assert wait_done(sessions, nxt).status == "succeeded"


@pytest.mark.parametrize("allowed", [True, False])
def test_degrade_happens_at_most_once(settings, sessions, broker, allowed):
    """Still too big after degrading: a second degrade is not tried; plain retries run out."""
    with thread_workers(settings, video_model=f"{GEN}:SizeLimitedVideo") as app:
        jid = submit(sessions, app, width=512, height=512, allow_degraded=allowed)
        job = wait_done(sessions, jid)
    assert (job.status, job.error_code) == ("failed", "out_of_memory")
    assert events(sessions, jid).count("job.degraded") == (1 if allowed else 0)
    with sessions() as s:
        assert s.scalars(select(Job.id)).all() == [jid]
