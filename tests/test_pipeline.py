"""The text -> video chain through a real Celery worker and Redis, with the zero-cost generators."""

from __future__ import annotations

import time
import uuid

import av
from sqlalchemy import select

from models import Job, JobEvent
from models.db import transaction
from tasks.contract.publish import publish_job


def _submit(sessions, celery_app, modality: str = "video", prompt: str = "a red fox", **params) -> uuid.UUID:
    defaults = (
        {"width": 64, "height": 48, "num_frames": 9, "fps": 6, "steps": 3} if modality == "video" else {}
    )
    with transaction(sessions) as s:
        job = Job(modality=modality, prompt=prompt, params=defaults | params)
        s.add(job)
        s.flush()
        jid = job.id
    publish_job(celery_app, jid, modality, "normal")
    return jid


def _wait(sessions, jid: uuid.UUID, timeout: float = 30) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sessions() as s:
            job = s.get(Job, jid)
            if job.status in ("succeeded", "failed", "canceled"):
                return job
        time.sleep(0.05)
    raise AssertionError(f"job {jid} did not finish: {job.status}/{job.stage}")


def _events(sessions, jid: uuid.UUID) -> list[str]:
    with sessions() as s:
        return list(s.scalars(select(JobEvent.type).where(JobEvent.job_id == jid).order_by(JobEvent.id)))


def test_video_chain_runs_both_stages(worker, sessions, celery_app, settings) -> None:
    jid = _submit(sessions, celery_app)
    job = _wait(sessions, jid)
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
    job = _wait(sessions, jid)
    assert job.status == "succeeded"
    assert job.stage == "text" and job.artifact_path is None
    assert not (settings.artifact_dir / str(jid)).exists()


def test_permanent_generator_error_fails_job_once(worker, sessions, celery_app) -> None:
    jid = _submit(sessions, celery_app, prompt="please [[fail]] now")
    job = _wait(sessions, jid)
    assert (job.status, job.error_stage, job.error_code) == ("failed", "text", "invalid_request")
    assert _events(sessions, jid).count("job.failed") == 1


def test_many_jobs_all_finish_once(worker, sessions, celery_app) -> None:
    ids = [_submit(sessions, celery_app, prompt=f"prompt {i}") for i in range(20)]
    for jid in ids:
        assert _wait(sessions, jid).status == "succeeded"
    with sessions() as s:
        succeeded = s.scalars(select(JobEvent.job_id).where(JobEvent.type == "job.succeeded")).all()
    assert sorted(succeeded) == sorted(ids)
