"""Periodic upkeep (celery beat): re-enqueue or fail stuck jobs, finish compensation, expire keys."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timedelta

from celery import Celery, Task, shared_task
from sqlalchemy import delete, false, select
from sqlalchemy.orm import Session

from models import IdempotencyKey, Job, JobStatus, Priority, Stage, variants
from models.base import utcnow
from models.db import transaction
from models.recovery import FINISHED_UNSUCCESSFULLY, claim_recovery, log_recovery, undo_recovery
from models.settings import Settings
from tasks import compensation, failures, inflight
from tasks.contract import names
from tasks.contract.publish import publish_job, publish_postprocess
from tasks.contract.stages import ENTRY_STAGE, QUEUES, RENDER_STAGES
from tasks.contract.transient import TRANSIENT_ERRORS
from tasks.metrics import metrics
from tasks.runtime import Runtime, runtime

log = logging.getLogger(__name__)

BATCH = 200  # jobs looked at per category per run: a backlog drains over a few runs
# Lost-message suspects per stage and priority per run. A lost message is taken at the head of
# its list, when every older message of its priority has gone: its job is among the oldest
# waiting of that priority, so a small batch of the oldest finds it.
SUSPECTS = 50


@shared_task(bind=True, name=names.REAP_STUCK_JOBS, ignore_result=True)
def reap_stuck_jobs(self: Task[[], dict[str, int]]) -> dict[str, int]:
    """The beat entry point; see reap()."""
    counts = reap(runtime(self.app), self.app)
    for action, n in counts.items():
        metrics().reaper_actions.labels(action).inc(n)
    if any(counts.values()):
        log.warning("reaper: %s", counts)
    return counts


def reap(rt: Runtime, app: Celery, now: datetime | None = None) -> dict[str, int]:
    """One pass: every active job past its deadline is re-enqueued or, out of recoveries, failed.

    - running, stage past its deadline (worker died, message lost): publish the stage again;
    - queued, committed but never published: publish it;
    - queued, published but not started for queued_timeout_s: publish it again;
    - queued (or waiting for its video stage, or for a stage republished above) for
      lost_message_after_s with no message left in the broker: publish it again (_lost_messages);
    - failed or canceled but never compensated: compensate;
    - succeeded with an output variant pending, unchanged for variant_stall_s: publish its
      post-processing again (tasks.variants; it makes only what is still pending);
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
        counts[_recover(rt, app, job, job.stage or ENTRY_STAGE, "stage_timeout", "overdue")] += 1
    for job in unpublished:
        counts[_recover(rt, app, job, ENTRY_STAGE, "not_published", "unpublished")] += 1
    for job in stale:
        counts[_recover(rt, app, job, ENTRY_STAGE, "queue_timeout", "stale_queued")] += 1
    for job, stage in _lost_messages(rt, app, now):
        counts[_recover(rt, app, job, stage, "message_lost", "lost_message")] += 1
    for job_id in uncompensated:
        counts["compensated"] += compensation.compensate_job(rt, job_id)
    with rt.sessions() as session:  # output variants whose post-processing message went missing
        stalled = variants.stalled(session, now, s.variant_stall_s, BATCH)
    counts["variants_republished"] = sum(publish_postprocess(app, job_id) for job_id in stalled)
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
    except TRANSIENT_ERRORS as exc:
        log.warning("reaper: job %s not republished (%s); next run", job.id, type(exc).__name__)
        with transaction(rt.sessions) as session:
            undo_recovery(session, job.id, undo)
        return "publish_failed"
    with transaction(rt.sessions) as session:
        log_recovery(session, job.id, {"reason": why, "stage": stage, "recovery": job.recoveries + 1})
    return f"requeued_{why}"


def _lost_messages(rt: Runtime, app: Celery, now: datetime) -> list[tuple[Job, str]]:
    """Jobs waiting for a stage past lost_message_after_s whose message the broker no longer has.

    Suspects are the oldest waiting per stage and priority (indexed, SUSPECTS each); the broker
    is asked about them only (tasks.inflight), so a deep but healthy backlog costs one scan of
    the stage's lists per run and republishes nothing. Only Redis loses messages this way.
    """
    s = rt.settings
    if not inflight.supported(s.broker_url):
        return []
    with rt.sessions() as session:
        waiting = {
            Stage.TEXT: _text_suspects(session, now, s.lost_message_after_s, s.queued_timeout_s)
            + _stage_suspects(session, Stage.TEXT, now, s),
            **{stage: _stage_suspects(session, stage, now, s) for stage in RENDER_STAGES},
        }
    lost: list[tuple[Job, str]] = []
    for stage, jobs in waiting.items():
        if not jobs:
            continue
        by_task = {names.stage_task_id(str(job.id), stage): job for job in jobs}
        queue = QUEUES[stage]
        try:
            held = s.lost_message_after_s
            live = inflight.live_task_ids(app, queue, by_task, held_for_s=held, at=now.timestamp())
        except TRANSIENT_ERRORS as exc:
            log.warning("reaper: could not look for lost %s messages (%s)", stage, type(exc).__name__)
            continue
        if live is None:
            log.warning("reaper: %s queue too long to look for lost messages this run", stage)
            continue
        lost += [(job, str(stage)) for task_id, job in by_task.items() if task_id not in live]
    return lost


def _text_suspects(session: Session, now: datetime, after_s: float, timeout_s: float) -> list[Job]:
    """Queued jobs (not cache followers, which hold no message) published after_s ago or more.

    Those past queued_timeout_s are the stale_queued rule's.
    """
    jobs: list[Job] = []
    for priority in Priority:
        jobs += session.scalars(
            select(Job)
            .where(
                Job.status == JobStatus.QUEUED,
                Job.priority == priority,
                Job.cached == false(),
                Job.published_at < now - timedelta(seconds=after_s),
                Job.published_at >= now - timedelta(seconds=timeout_s),
            )
            .order_by(Job.published_at)
            .limit(SUSPECTS)
        ).all()
    return jobs


def _stage_suspects(session: Session, stage: Stage, now: datetime, s: Settings) -> list[Job]:
    """Running jobs waiting after_s or more for a `stage` message: the video stage after text,
    or a stage the reaper published again (overdue), not entered since.

    Sending such a message sets the deadline queued_timeout_s ahead; entering the stage (or a
    retry) sets it at most `in_stage` ahead, so a deadline further out than that marks a job
    still waiting, and the deadline orders them by wait. Past it they are the overdue rule's.
    """
    in_stage = failures.hard_limit(s, stage) + s.stage_grace_s + s.retry_backoff_max_s
    jobs: list[Job] = []
    for priority in Priority:
        jobs += session.scalars(
            select(Job)
            .where(
                Job.status == JobStatus.RUNNING,
                Job.stage == stage,
                Job.priority == priority,
                Job.deadline_at > now + timedelta(seconds=in_stage),
                Job.deadline_at < now + timedelta(seconds=s.queued_timeout_s - s.lost_message_after_s),
            )
            .order_by(Job.deadline_at)
            .limit(SUSPECTS)
        ).all()
    return jobs


def _give_up_message(job: Job, stage: str, why: str) -> str:
    reasons = {
        "overdue": f"{stage} stage did not finish before its deadline",
        "unpublished": "the job could not be handed to the queue",
        "stale_queued": "no worker took the job",
        "lost_message": f"the {stage} stage's queue message was lost",
    }
    return f"{reasons[why]} ({job.recoveries} recoveries tried)"
