"""The retention task (celery beat): expired jobs' files, output text and prompt removed, rows kept."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import datetime

from celery import Task, shared_task

from models import retention
from models.db import transaction
from tasks import artifacts
from tasks.contract import names
from tasks.runtime import Runtime, runtime

log = logging.getLogger(__name__)


@shared_task(bind=True, name=names.EXPIRE_ARTIFACTS, ignore_result=True)
def expire_artifacts(self: Task[[], int]) -> int:
    """The beat entry point; see expire()."""
    removed = expire(runtime(self.app))
    if removed:
        log.info("retention: data of %d expired jobs removed", removed)
    return removed


def expire(rt: Runtime, now: datetime | None = None) -> int:
    """One bounded pass: at most retention_batch expired jobs (past their tenant's plan
    retention) lose their data; returns how many.

    The rows stay locked (SKIP LOCKED) while their folders go and until they are marked, so two
    runs at once never take the same job, and a crash between the two leaves them unmarked for
    the next run (removing a folder again is a no-op).
    """
    s = rt.settings
    with transaction(rt.sessions) as session:
        ids = retention.lock_expired(session, s, s.retention_batch, now)
        remove_files(rt, ids)
        return retention.mark_removed(session, ids)


def remove_files(rt: Runtime, job_ids: Iterable[uuid.UUID]) -> None:
    """Each job's own folder (a cached copy has none: it pointed at its source's files)."""
    for job_id in job_ids:
        artifacts.remove_job_dir(rt.storage, job_id)
