"""Reliability transitions: stage deadlines, retries, degraded retries, reaper recoveries, compensation.

Same rules as models.states: one conditional UPDATE each, its event row in the same
transaction, and False when the WHERE clause matched nothing (someone got there first).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Integer, and_, bindparam, case, update
from sqlalchemy.orm import Session

from models import events
from models.base import utcnow
from models.job import ACTIVE, Job, JobEvent, JobStatus, Stage
from models.states import _transition
from models.transition_sql import Bound

FINISHED_UNSUCCESSFULLY = (JobStatus.FAILED, JobStatus.CANCELED)


def deadline_in(seconds: float) -> datetime:
    return utcnow() + timedelta(seconds=seconds)


def set_deadline(session: Session, job_id: uuid.UUID, seconds: float) -> bool:
    """The active job is overdue (a reaper candidate) `seconds` from now."""
    return _transition(session, job_id, Job.status.in_(ACTIVE), {"deadline_at": deadline_in(seconds)}, None)


def entry_deadline(seconds: float, max_attempts: int) -> Bound:
    """deadline_at for an UPDATE that enters a stage and counts one more attempt.

    `seconds` from now while the attempt is within max_attempts; past that the stage fails at
    once instead of running, so the deadline stays as it was (the SET sees the old attempts).
    """
    return Bound(
        "entry_deadline",
        _entry_deadline_sql,
        {"entry_max_attempts": max_attempts, "entry_deadline_at": deadline_in(seconds)},
    )


def _entry_deadline_sql() -> ColumnElement[datetime]:
    within = Job.attempts + 1 <= bindparam("entry_max_attempts", type_=Integer)
    return case((within, bindparam("entry_deadline_at", type_=Job.deadline_at.type)), else_=Job.deadline_at)


def record_retry(
    session: Session, job_id: uuid.UUID, stage: Stage, data: dict[str, Any], deadline_s: float
) -> bool:
    """A stage will run again after a countdown: push its deadline out and log why."""
    return _transition(
        session,
        job_id,
        and_(Job.status == JobStatus.RUNNING, Job.stage == stage),
        {"deadline_at": utcnow() + timedelta(seconds=deadline_s)},
        "job.retrying",
        event_data={"stage": stage, **data},
    )


def degrade(session: Session, job_id: uuid.UUID, record: dict[str, Any], stage: Stage = Stage.VIDEO) -> bool:
    """Record the one degraded retry of a render stage; False if it already degraded."""
    return _transition(
        session,
        job_id,
        and_(Job.status == JobStatus.RUNNING, Job.stage == stage, Job.degraded.is_(None)),
        {"degraded": record},
        "job.degraded",
        event_data=record,
    )


def claim_recovery(
    session: Session, job: Job, deadline_s: float, *, republished: bool = False
) -> dict[str, Any] | None:
    """Claim the reaper's intervention on `job` as it was read; None if it moved on since.

    Returns the values to put back (undo_recovery) if the stage then cannot be published.
    """
    seen = {"deadline_at": job.deadline_at, "published_at": job.published_at}
    values: dict[str, Any] = {
        "recoveries": job.recoveries + 1,
        "deadline_at": utcnow() + timedelta(seconds=deadline_s),
    }
    if republished:
        values["published_at"] = utcnow()
    unchanged = and_(
        Job.status == job.status,
        Job.recoveries == job.recoveries,
        Job.deadline_at.is_(None) if job.deadline_at is None else Job.deadline_at == job.deadline_at,
    )
    if not _transition(session, job.id, unchanged, values, None):
        return None
    return {"recoveries": job.recoveries, **{k: v for k, v in seen.items() if k in values}, "_set": values}


def undo_recovery(session: Session, job_id: uuid.UUID, undo: dict[str, Any]) -> bool:
    """Put back what claim_recovery changed, unless something else changed the job since."""
    done = undo.pop("_set")
    return _transition(
        session, job_id, and_(Job.recoveries == done["recoveries"], Job.deadline_at == done["deadline_at"]),
        undo, None,
    )  # fmt: skip


def log_recovery(session: Session, job_id: uuid.UUID, data: dict[str, Any]) -> None:
    session.add(JobEvent(job_id=job_id, type="job.recovered", data=data))
    events.notify(session, job_id)


def mark_compensated(
    session: Session,
    job_id: uuid.UUID,
    data: dict[str, Any],
    then: Callable[[], dict[str, Any]] | None = None,
) -> bool:
    """Claim the job's compensation: True exactly once per failed or canceled job.

    `then` runs only for the claim that won, before the event row is written (the notify below
    flushes it), and what it returns is added to `data`: the releases go into the event.
    """
    stmt = (
        update(Job)
        .where(
            Job.id == job_id,
            Job.status.in_(FINISHED_UNSUCCESSFULLY),
            Job.compensated_at.is_(None),
        )
        .values(compensated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if session.execute(stmt).rowcount != 1:  # type: ignore[attr-defined]
        return False
    if then is not None:
        data.update(then())
    session.add(JobEvent(job_id=job_id, type="job.compensated", data=data))
    events.notify(session, job_id)
    return True
