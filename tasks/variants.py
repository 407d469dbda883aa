"""The post-processing task: a succeeded video job's output variants, made on the CPU `post` queue.

The video stage publishes it after the job's success commit (tasks.outcome.settle), so the GPU
worker goes on to the next job and the job is `succeeded` with its MP4 alone. Each pending variant
is made from the job's MP4 and written under the job's folder at a fixed key (a redelivery rewrites
the same object; retention and DELETE remove it with the folder), then recorded ready or failed
(models.variants). A variant's failure never fails the job; a transient error retries with backoff.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded

from models import Job, JobStatus
from models import variants as slots
from models.db import transaction
from tasks import artifacts
from tasks.contract import names
from tasks.contract.transient import is_transient
from tasks.failures import backoff
from tasks.media import EncodeError
from tasks.runtime import Runtime, runtime
from tasks.variant_media import decode, write_preview, write_upscaled, write_webm

log = logging.getLogger(__name__)

Maker = Callable[[np.ndarray, int, str, Job, Runtime], int]


def _webm(frames: np.ndarray, fps: int, path: str, job: Job, rt: Runtime) -> int:
    return write_webm(frames, fps, path)


def _preview(frames: np.ndarray, fps: int, path: str, job: Job, rt: Runtime) -> int:
    return write_preview(frames, fps, path)


def _upscale(frames: np.ndarray, fps: int, path: str, job: Job, rt: Runtime) -> int:
    factor = int((job.params or {}).get("upscale_factor", 2))
    return write_upscaled(
        frames, fps, path, factor, model_dir=rt.settings.upscale_model_dir, steps=rt.settings.upscale_steps,
        prompt=job.output_text or job.prompt,  # what the video was rendered from: the upscaler's condition
    )  # fmt: skip


MAKERS: dict[str, Maker] = {"webm": _webm, "preview": _preview, "upscale": _upscale}


class Retry(Exception):
    """A transient error: the task runs again later for the variants still pending."""


@shared_task(bind=True, name=names.POSTPROCESS)
def postprocess(self: Task[[str], None], job_id: str) -> None:
    """Make the job's pending variants (none left: a redelivery, nothing to do)."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    try:
        _postprocess(rt, jid)
    except Retry as exc:
        retries = self.request.retries or 0
        if retries >= rt.settings.variant_max_retries:
            with transaction(rt.sessions) as s:
                job = s.get(Job, jid)
                left = slots.pending(job) if job is not None else []
                slots.fail_pending(s, jid, left, f"gave up after {retries + 1} tries: {exc}")
            return
        countdown = backoff(rt.settings.retry_backoff_s, rt.settings.retry_backoff_max_s, retries)
        log.warning("job %s: variants retry in %.1f s (%s)", jid, countdown, exc)
        raise self.retry(countdown=countdown, max_retries=None) from exc


def _postprocess(rt: Runtime, jid: uuid.UUID) -> None:
    with rt.sessions() as s:
        job = s.get(Job, jid)
        if job is None or job.status != JobStatus.SUCCEEDED or job.data_removed_at is not None:
            return  # deleted or removed meanwhile: nothing to make, nothing to keep
        todo = slots.pending(job)
        s.expunge(job)
    if not todo or not job.artifact_path:
        return
    work = Path(tempfile.mkdtemp(prefix=f"genqueue-variants-{jid}-"))
    try:
        try:
            source = work / "source.mp4"
            with rt.storage.open(job.artifact_path) as reader, source.open("wb") as out:
                shutil.copyfileobj(reader, out)
            frames, fps = decode(str(source))
        except FileNotFoundError:
            _fail_all(rt, jid, todo, "the job's video is gone")
            return
        except EncodeError as exc:
            _fail_all(rt, jid, todo, str(exc))
            return
        except Exception as exc:
            if is_transient(exc) or isinstance(exc, OSError):
                raise Retry(f"reading the video: {exc}") from exc
            raise
        for done, name in enumerate(todo):
            try:
                _make(rt, job, name, frames, fps)
            except SoftTimeLimitExceeded:
                limit = rt.settings.variant_time_limit_s
                _fail_all(rt, jid, todo[done:], f"not made within variant_time_limit_s ({limit} s)")
                return
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _make(rt: Runtime, job: Job, name: str, frames: np.ndarray, fps: int) -> None:
    """One variant, written whole at its fixed key, then recorded; its failure recorded instead."""
    file_name, mimetype = names.VARIANT_FILES[name]
    key = names.artifact_key(job.id, file_name)
    try:
        with rt.storage.writing(key, mimetype) as path:
            size = MAKERS[name](frames, fps, str(path), job, rt)
    except SoftTimeLimitExceeded:
        raise
    except Exception as exc:
        if is_transient(exc) or (isinstance(exc, OSError) and not isinstance(exc, EncodeError)):
            raise Retry(f"{name}: {exc}") from exc  # the storage or a temp file went away: again later
        log.warning("job %s: variant %s failed: %s", job.id, name, exc)
        _record(rt, job.id, name, error=f"{type(exc).__name__}: {exc}")
        return
    _record(rt, job.id, name, key=key, size=size)


def _record(
    rt: Runtime,
    jid: uuid.UUID,
    name: str,
    key: str | None = None,
    size: int | None = None,
    error: str | None = None,
) -> None:
    with transaction(rt.sessions) as s:
        done = slots.record(s, jid, name, key=key, size=size, error=error)
    if done == "gone":
        artifacts.remove_job_dir(rt.storage, jid)  # deleted while this ran: what it wrote goes too


def _fail_all(rt: Runtime, jid: uuid.UUID, todo: list[str], error: str) -> None:
    with transaction(rt.sessions) as s:
        slots.fail_pending(s, jid, todo, error)
