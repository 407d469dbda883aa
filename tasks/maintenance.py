"""Periodic upkeep (celery beat): re-enqueue or fail stuck jobs, finish compensation, expire keys."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timedelta

from celery import Celery, Task, shared_task
from sqlalchemy import delete, select

from models import IdempotencyKey, Job, JobStatus
from models.base import utcnow
from models.db import transaction
from models.recovery import FINISHED_UNSUCCESSFULLY, claim_recovery, log_recovery, undo_recovery
from tasks import compensation, failures, names
from tasks.publish import publish_job
from tasks.runtime import Runtime, runtime

log = logging.getLogger(__name__)

BATCH = 200  # jobs looked at per category per run: a backlog drains over a few runs


@shared_task(bind=True, name=names.REAP_STUCK_JOBS, ignore_result=True)
def reap_stuck_jobs(self: Task[[], dict[str, int]]) -> dict[str, int]:
    """The beat entry point; see reap()."""
    counts = reap(runtime(self.app), self.app)
    if any(counts.values()):
        log.warning("reaper: %s", counts)
    return counts


def reap(rt: Runtime, app: Celery, now: datetime | None = None) -> dict[str, int]:
    """One pass: every active job past its deadline is re-enqueued or, out of recoveries, failed.

    - running, stage past its deadline (worker died, message lost): publish the stage again;
    - queued, committed but never published: publish it;
    - queued, published but not started for queued_timeout_s: publish it again;
    - failed or canceled but never compensated: compensate;
    - idempotency keys past their expiry: delete.
    Republishing is safe because the stages are idempotent; each costs the job a recovery.
    """
    now = now or utcnow()
    s = rt.settings
    counts: Counter[str] = Counter()
    grace = timedelta(seconds=s.publish_grace_s)
    with rt.sessions() as session:
        overdue = session.scalars(
            select(Job)
            .where(Job.status == JobStatus.RUNNING, Job.deadline_at < now)
            .order_by(Job.deadline_at)
            .limit(BATCH)
        ).all()
        unpublished = session.scalars(
            select(Job)
            .where(
                Job.status == JobStatus.QUEUED,
                Job.published_at.is_(None),
                Job.created_at < now - grace,
            )
            .limit(BATCH)
        ).all()
        stale = session.scalars(
            select(Job)
            .where(
                Job.status == JobStatus.QUEUED,
                Job.published_at < now - timedelta(seconds=s.queued_timeout_s),
            )
            .limit(BATCH)
        ).all()
        uncompensated = session.scalars(
            select(Job.id)
            .where(
                Job.status.in_(FINISHED_UNSUCCESSFULLY),
                Job.compensated_at.is_(None),
                Job.completed_at < now - grace,
            )
            .limit(BATCH)
        ).all()
    for job in overdue:
        counts[_recover(rt, app, job, job.stage or "text", "stage_timeout", "overdue")] += 1
    for job in unpublished:
        counts[_recover(rt, app, job, "text", "not_published", "unpublished")] += 1
    for job in stale:
        counts[_recover(rt, app, job, "text", "queue_timeout", "stale_queued")] += 1
    for job_id in uncompensated:
        counts["compensated"] += compensation.compensate_job(rt, job_id)
    with transaction(rt.sessions) as session:
        expired = session.execute(delete(IdempotencyKey).where(IdempotencyKey.expires_at < now))
        counts["keys_expired"] = expired.rowcount or 0  # type: ignore[attr-defined]
    return {k: v for k, v in counts.items() if v}


def _recover(rt: Runtime, app: Celery, job: Job, stage: str, code: str, why: str) -> str:
    """Publish the job's stage again, or fail it once it has used up its recoveries."""
    s = rt.settings
    if job.recoveries >= s.max_recoveries:
        message = _give_up_message(job, stage, why)
        failed = compensation.fail_and_compensate(rt, job.id, code, message, stage)
        return "failed" if failed else "skipped"
    with transaction(rt.sessions) as session:
        # Claimed before publishing, so a worker that starts at once is not undone. The job
        # waits in the queue again; entering the stage sets the stage's own deadline.
        undo = claim_recovery(session, job, s.queued_timeout_s, republished=job.status == JobStatus.QUEUED)
    if undo is None:
        return "skipped"  # a worker or another reaper moved it meanwhile
    try:
        publish_job(app, job.id, job.modality, job.priority, stage=stage)
    except failures.INFRA_ERRORS as exc:
        log.warning("reaper: job %s not republished (%s); next run", job.id, type(exc).__name__)
        with transaction(rt.sessions) as session:
            undo_recovery(session, job.id, undo)
        return "publish_failed"
    with transaction(rt.sessions) as session:
        log_recovery(session, job.id, {"reason": why, "stage": stage, "recovery": job.recoveries + 1})
    return f"requeued_{why}"


def _give_up_message(job: Job, stage: str, why: str) -> str:
    reasons = {
        "overdue": f"{stage} stage did not finish before its deadline",
        "unpublished": "the job could not be handed to the queue",
        "stale_queued": "no worker took the job",
    }
    return f"{reasons[why]} ({job.recoveries} recoveries tried)"

