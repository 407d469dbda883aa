"""What a stage does when something goes wrong: retry, degrade, fail once, or hand the message back."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import sqlalchemy.exc
from celery import Task
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded

from models import Job, Stage
from models.db import transaction
from models.recovery import degrade, record_retry
from models.settings import Settings
from tasks import compensation
from tasks.contract.stages import spec_for
from tasks.contract.transient import TRANSIENT_ERRORS, is_transient
from tasks.generators.base import Canceled, GeneratorError, ImageRequest, OutOfMemory, VideoRequest
from tasks.generators.registry import release_memory
from tasks.metrics import metrics
from tasks.runtime import Runtime

log = logging.getLogger(__name__)

# What infra_retry catches: a transient error, or a DBAPIError that is_transient() may judge one.
_RETRIED: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, sqlalchemy.exc.DBAPIError)


def backoff(base: float, cap: float, retries: int) -> float:
    """Exponential backoff with jitter: uniform in [x/2, x], x = min(cap, base * 2**retries)."""
    ceiling = min(cap, base * 2**retries)
    return random.uniform(ceiling / 2, ceiling)


def hard_limit(settings: Settings, stage: Stage) -> int:
    """The stage's hard time limit: how long a running stage can take before it is overdue."""
    return spec_for(settings, stage).time_limit_s


def _retry(task: Task[Any, Any], countdown: float, exc: Exception) -> NoReturn:
    """Publish the retry; if even that fails, hand the message back instead of dropping it."""
    try:
        raise task.retry(exc=exc, countdown=countdown, max_retries=task.request.retries + 1)
    except Reject as rej:  # Celery rejects *without* requeue when the retry cannot be published
        raise Reject(rej.reason, requeue=True) from exc  # type: ignore[attr-defined]  # not in the stubs


@contextmanager
def infra_retry(task: Task[Any, Any], rt: Runtime, job_id: uuid.UUID, stage: str | None) -> Iterator[None]:
    """Around a whole task: database/broker outages become bounded retries with backoff."""
    try:
        yield
    except _RETRIED as exc:
        if not is_transient(exc) or task.request.retries >= rt.settings.infra_max_retries:
            raise  # the errback and, behind it, the reaper take over
        s = rt.settings
        countdown = backoff(s.infra_backoff_s, s.infra_backoff_max_s, task.request.retries)
        log.warning(
            "job %s %s: %s unavailable (%s); retry in %.1fs",
            job_id, stage or "compensate", "database or broker", type(exc).__name__, countdown,
        )  # fmt: skip
        metrics().retries.labels(stage or "compensate", "infra").inc()
        _retry(task, countdown, exc)


def _classify(stage: Stage, exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, SoftTimeLimitExceeded):
        return "timeout", f"{stage} stage exceeded its time limit"
    if isinstance(exc, GeneratorError):
        return exc.code, str(exc) or exc.code
    log.error("%s stage failed unexpectedly", stage, exc_info=exc)
    return "internal_error", f"{stage} stage failed unexpectedly"


def handle(
    task: Task[Any, Any],
    rt: Runtime,
    job: Job,
    stage: Stage,
    exc: Exception,
    render_request: VideoRequest | ImageRequest | None = None,
    attempts: int | None = None,
) -> NoReturn:
    """Retry transient errors with backoff, degrade once if allowed, else fail and compensate once.

    `attempts`: what the retry budget counts, when not the job's stage attempts (a storyboard
    shot's own: each shot retries on its own).
    """
    job_id, settings = job.id, rt.settings
    tries = job.attempts if attempts is None else attempts
    if is_transient(exc):
        raise exc  # infra_retry's business
    if isinstance(exc, Canceled):
        # The cancel endpoint moved the job to canceled; drop what this stage wrote.
        compensation.compensate_job(rt, job_id)
        raise Ignore()
    oom, timeout = isinstance(exc, OutOfMemory), isinstance(exc, SoftTimeLimitExceeded)
    if oom or timeout:
        release_memory()  # so the retry, or this worker's next task, fits
    # Only a stage with a request the degrade plan can shrink passes one (the render stages).
    if (oom or timeout) and render_request is not None:
        from tasks.degrade import plan  # here: the degrade path is rare

        record = plan(job, render_request, settings, "out_of_memory" if oom else "timeout")
        if record is not None:
            with transaction(rt.sessions) as s:
                recorded = degrade(s, job_id, record, stage)
                data = {"attempt": job.attempts, "code": "degraded", "countdown": 0}
                record_retry(s, job_id, stage, data, hard_limit(settings, stage) + settings.stage_grace_s)
            if recorded:
                reason = record["reason"]
                log.warning("job %s %s stage: %s; retrying degraded: %s", job_id, stage, reason, record)
                metrics().degradations.labels(record["reason"]).inc()
                metrics().retries.labels(stage, "degraded").inc()
                _retry(task, 0, exc)
    retryable = isinstance(exc, GeneratorError) and exc.retryable
    if retryable and tries <= settings.max_retries:
        countdown = backoff(settings.retry_backoff_s, settings.retry_backoff_max_s, tries - 1)
        code = getattr(exc, "code", type(exc).__name__)
        with transaction(rt.sessions) as s:
            data = {"attempt": tries, "code": code, "countdown": round(countdown, 3)}
            deadline = countdown + hard_limit(settings, stage) + settings.stage_grace_s
            record_retry(s, job_id, stage, data, deadline)
        log.warning("job %s %s stage: %s; retry %d in %.2fs", job_id, stage, exc, tries, countdown)
        metrics().retries.labels(stage, code).inc()
        _retry(task, countdown, exc)
    code, message = _classify(stage, exc)
    compensation.fail_and_compensate(rt, job_id, code, message, stage)
    raise Ignore()  # the job is failed and cleaned up: stop the chain, ack the message
