"""The text -> video chain through a real Celery worker and Redis, with the zero-cost generators."""

from __future__ import annotations

import uuid

import av
from sqlalchemy import select

from models import JobEvent
from tasks.contract.publish import publish_job
from tests.support.jobs import create_job, wait_done


def _submit(sessions, celery_app, modality: str = "video", prompt: str = "a red fox", **params) -> uuid.UUID:
    """A job committed and published (nine frames for a video), without marking it published."""
    frames = {"num_frames": 9} if modality == "video" else {}
    jid = create_job(sessions, modality, prompt, **(frames | params))
    publish_job(celery_app, jid, modality, "normal")
    return jid


def _events(sessions, jid: uuid.UUID) -> list[str]:
    with sessions() as s:
        return list(s.scalars(select(JobEvent.type).where(JobEvent.job_id == jid).order_by(JobEvent.id)))


def test_video_chain_runs_both_stages(worker, sessions, celery_app, settings) -> None:
    jid = _submit(sessions, celery_app)
    job = wait_done(sessions, jid, 30)
    assert job.status == "succeeded", job.error_message
    assert job.output_text and "a red fox" in job.output_text
    assert job.progress == 100 and job.attempts == 1
    assert job.text_s is not None and job.video_s is not None
    path = settings.artifact_dir / job.artifact_path
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        assert (stream.codec_context.name, stream.width, stream.height) == ("h264", 64, 48)
        assert len(frames) == 9
    assert (path.parent / "thumbnail.jpg").exists()
    assert _events(sessions, jid) == ["job.started", "job.text.completed", "job.succeeded"]


def test_text_job_runs_text_stage_only(worker, sessions, celery_app, settings) -> None:
    jid = _submit(sessions, celery_app, modality="text", prompt="a haiku about queues")
    job = wait_done(sessions, jid, 30)
    assert job.status == "succeeded"
    assert job.stage == "text" and job.artifact_path is None
    assert not (settings.artifact_dir / str(jid)).exists()


def test_permanent_generator_error_fails_job_once(worker, sessions, celery_app) -> None:
    jid = _submit(sessions, celery_app, prompt="please [[fail]] now")
    job = wait_done(sessions, jid, 30)
    assert (job.status, job.error_stage, job.error_code) == ("failed", "text", "invalid_request")
    assert _events(sessions, jid).count("job.failed") == 1


def test_many_jobs_all_finish_once(worker, sessions, celery_app) -> None:
    ids = [_submit(sessions, celery_app, prompt=f"prompt {i}") for i in range(20)]
    for jid in ids:
        assert wait_done(sessions, jid, 30).status == "succeeded"
    with sessions() as s:
        succeeded = s.scalars(select(JobEvent.job_id).where(JobEvent.type == "job.succeeded")).all()
    assert sorted(succeeded) == sorted(ids)
