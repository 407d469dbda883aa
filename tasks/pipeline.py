"""The pipeline tasks: generate_text -> generate_video, and compensate on failure.

Every task takes a job id, reads what it needs from the database, and records its
outcome through the conditional transitions in models.states, so a redelivered or
duplicated message finds the job already past that point and does nothing.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from typing import Any

from celery import Task, shared_task
from celery.exceptions import Ignore, SoftTimeLimitExceeded

from models import Job, JobStatus, Modality, Stage, states
from models.db import transaction
from tasks import artifacts, names
from tasks.batching import run_batched
from tasks.generators.base import Canceled, GeneratorError, TextRequest, VideoRequest
from tasks.runtime import Runtime, runtime
from tasks.watch import JobWatch

log = logging.getLogger(__name__)

TEXT_DONE_PROGRESS = 20  # a video job's progress when its text stage is done


def _backoff(rt: Runtime, retries: int) -> float:
    """Exponential backoff with full jitter, capped."""
    cap = min(rt.settings.retry_backoff_max_s, rt.settings.retry_backoff_s * 2**retries)
    return random.uniform(cap / 2, cap)


def _enter_stage(rt: Runtime, job_id: uuid.UUID, stage: Stage) -> Job | None:
    """Move the job into `stage` (or re-enter it on redelivery); None when there is nothing to do."""
    with transaction(rt.sessions) as s:
        job = s.get(Job, job_id)
        if job is None:
            log.warning("job %s not found; dropping %s stage", job_id, stage)
            return None
        entered = (stage == Stage.TEXT and states.start_text(s, job_id)) or states.resume_stage(
            s, job_id, stage
        )
        if not entered:
            log.info("job %s is %s/%s; %s stage has nothing to do", job_id, job.status, job.stage, stage)
            return None
        s.refresh(job)
        if job.attempts > rt.settings.max_retries + 1:
            # A message that keeps coming back (its worker keeps dying) must not loop forever.
            states.fail(
                s,
                job_id,
                "too_many_attempts",
                f"{stage} stage gave up after {job.attempts - 1} attempts",
                stage,
            )
            artifacts.remove_job_dir(rt.artifact_dir, job_id)
            return None
        return job


def _handle_error(task: Task, rt: Runtime, job_id: uuid.UUID, stage: Stage, exc: BaseException) -> None:
    """Retry transient errors with backoff, fail permanent ones once; never returns normally."""
    if isinstance(exc, Canceled):
        # The cancel endpoint already moved the job to canceled; drop what this stage wrote.
        artifacts.remove_job_dir(rt.artifact_dir, job_id)
        raise Ignore()
    if isinstance(exc, GeneratorError) and exc.retryable and task.request.retries < rt.settings.max_retries:
        log.warning("job %s %s stage: %s; retrying", job_id, stage, exc)
        raise task.retry(exc=exc, countdown=_backoff(rt, task.request.retries))
    if isinstance(exc, SoftTimeLimitExceeded):
        code, message = "timeout", f"{stage} stage exceeded its time limit"
    elif isinstance(exc, GeneratorError):
        code, message = exc.code, str(exc) or exc.code
    else:
        code, message = "internal_error", f"{stage} stage failed unexpectedly"
        log.exception("job %s %s stage failed", job_id, stage, exc_info=exc)
    with transaction(rt.sessions) as s:
        states.fail(s, job_id, code, message, stage)
    artifacts.remove_job_dir(rt.artifact_dir, job_id)
    raise Ignore()  # the job is failed and cleaned up: stop the chain, ack the message


@shared_task(bind=True, name=names.GENERATE_TEXT)
def generate_text(self: Task, job_id: str) -> None:
    """Turn the prompt into text (the final output, or the video stage's shot description)."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    job = _enter_stage(rt, jid, Stage.TEXT)
    if job is None:
        return
    p: dict[str, Any] = job.params or {}
    request = TextRequest(
        prompt=job.prompt,
        max_new_tokens=int(p.get("max_new_tokens", rt.settings.default_max_new_tokens)),
        temperature=float(p.get("temperature", 0.0)),
        seed=p.get("seed"),
    )
    watch = JobWatch(rt, jid, Stage.TEXT)
    try:
        started = time.monotonic()
        result = run_batched(self, rt.settings, request, should_cancel=watch.canceled)
        if result.error is not None:
            raise result.error
    except Exception as exc:
        _handle_error(self, rt, jid, Stage.TEXT, exc)
        return
    final = job.modality == Modality.TEXT
    with transaction(rt.sessions) as s:
        states.complete_text(
            s,
            jid,
            result.text,
            round(time.monotonic() - started, 3),
            final=final,
            progress=TEXT_DONE_PROGRESS,
        )


@shared_task(bind=True, name=names.GENERATE_VIDEO)
def generate_video(self: Task, job_id: str) -> None:
    """Render the shot description to frames and an MP4 (+ thumbnail) under the artifact dir."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    job = _enter_stage(rt, jid, Stage.VIDEO)
    if job is None:
        return
    s_ = rt.settings
    p: dict[str, Any] = job.params or {}
    request = VideoRequest(
        prompt=job.output_text or job.prompt,
        width=int(p.get("width", s_.default_width)),
        height=int(p.get("height", s_.default_height)),
        num_frames=int(p.get("num_frames", s_.default_num_frames)),
        fps=int(p.get("fps", s_.default_fps)),
        steps=int(p.get("steps", s_.default_steps)),
        seed=p.get("seed"),
    )
    watch = JobWatch(rt, jid, Stage.VIDEO, progress_from=TEXT_DONE_PROGRESS, progress_to=95)
    try:
        started = time.monotonic()
        result = run_batched(self, rt.settings, request, should_cancel=watch.canceled, on_step=watch.on_step)
        if result.error is not None:
            raise result.error
        seconds = round(time.monotonic() - started, 3)
        relpath, size = artifacts.write_video(rt.artifact_dir, jid, result.frames, result.fps)
    except Exception as exc:
        _handle_error(self, rt, jid, Stage.VIDEO, exc)
        return
    with transaction(rt.sessions) as s:
        done = states.complete_video(s, jid, relpath, size, seconds)
    if not done:
        # Canceled (or failed by the reaper) while rendering: the files are orphans now.
        with transaction(rt.sessions) as s:
            job = s.get(Job, jid)
            if job is not None and job.status != JobStatus.SUCCEEDED:
                artifacts.remove_job_dir(rt.artifact_dir, jid)


@shared_task(bind=True, name=names.COMPENSATE)
def compensate(self: Task, job_id: str) -> None:
    """Errback of the chain: fail the job if still active and remove partial artifacts (idempotent)."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    with transaction(rt.sessions) as s:
        job = s.get(Job, jid)
        if job is None:
            return
        states.fail(s, jid, "internal_error", "the pipeline failed unexpectedly", job.stage)
        succeeded = job.status == JobStatus.SUCCEEDED
    if not succeeded:
        artifacts.remove_job_dir(rt.artifact_dir, jid)
