"""Compensating actions for a failed or canceled job: remove its files, release what it holds, once."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from models import Job, JobStatus, states
from models.db import transaction
from models.recovery import FINISHED_UNSUCCESSFULLY, mark_compensated
from tasks import artifacts
from tasks.metrics import metrics
from tasks.runtime import Runtime

log = logging.getLogger(__name__)

# Releases of what a job holds (a quota slot, a GPU reservation...), run inside the
# transaction that records the compensation, so each runs exactly once per job.
ReleaseHook = Callable[[Session, Job], Any]
_release_hooks: list[ReleaseHook] = []


def on_release(hook: ReleaseHook) -> ReleaseHook:
    """Register a release hook (usable as a decorator); its return value is logged in the event."""
    if hook not in _release_hooks:
        _release_hooks.append(hook)
    return hook


def remove_release_hook(hook: ReleaseHook) -> None:
    if hook in _release_hooks:
        _release_hooks.remove(hook)


def compensate_job(rt: Runtime, job_id: uuid.UUID) -> bool:
    """Undo a failed or canceled job's side effects; True if this call recorded the compensation.

    File removal is idempotent and runs on every call (a late attempt may have written files
    after an earlier compensation). Releases and the `job.compensated` event run once: they
    commit together with the conditional claim of `compensated_at`.
    """
    with rt.sessions() as s:
        job = s.get(Job, job_id)
        status = job.status if job is not None else None
    if status not in FINISHED_UNSUCCESSFULLY:
        return False  # never touch a succeeded (or still active) job's files
    removed = artifacts.remove_job_dir(rt.storage, job_id)
    with transaction(rt.sessions) as s:
        job = s.get(Job, job_id)
        assert job is not None
        data: dict[str, Any] = {
            "status": job.status,
            "code": job.error_code,
            "stage": job.error_stage,
            "files_removed": removed,
        }
        def release() -> dict[str, Any]:
            released = [repr(hook(s, job)) for hook in _release_hooks]
            return {"released": released} if released else {}

        if not mark_compensated(s, job_id, data, then=release):
            return False
    metrics().compensations.labels(data["status"]).inc()
    log.info("job %s compensated: %s", job_id, data)
    return True


def fail_and_compensate(
    rt: Runtime, job_id: uuid.UUID, code: str, message: str, stage: str | None
) -> bool:
    """Fail the job if it is still active, then compensate; True if this call failed it."""
    with transaction(rt.sessions) as s:
        failed = states.fail(s, job_id, code, message, stage)
    compensate_job(rt, job_id)
    return failed


def is_succeeded(rt: Runtime, job_id: uuid.UUID) -> bool:
    with rt.sessions() as s:
        job = s.get(Job, job_id)
        return job is not None and job.status == JobStatus.SUCCEEDED
