"""Reliability transitions: stage deadlines, retries, degraded retries, reaper recoveries, compensation.

Same rules as models.states: one conditional UPDATE each, its event row in the same
transaction, and False when the WHERE clause matched nothing (someone got there first).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, update
from sqlalchemy.orm import Session

from models.base import utcnow
from models.job import ACTIVE, Job, JobEvent, JobStatus, Stage
from models.states import _transition

FINISHED_UNSUCCESSFULLY = (JobStatus.FAILED, JobStatus.CANCELED)


def set_deadline(session: Session, job_id: uuid.UUID, seconds: float) -> bool:
    """The active job is overdue (a reaper candidate) `seconds` from now."""
    return _transition(
        session,
        job_id,
        Job.status.in_(ACTIVE),
        {"deadline_at": utcnow() + timedelta(seconds=seconds)},
        None,
    )


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


def degrade(session: Session, job_id: uuid.UUID, record: dict[str, Any]) -> bool:
    """Record the one degraded retry of the video stage; False if it already degraded."""
    return _transition(
        session,
        job_id,
        and_(Job.status == JobStatus.RUNNING, Job.stage == Stage.VIDEO, Job.degraded.is_(None)),
        {"degraded": record},
        "job.degraded",
        event_data=record,
    )


def recover(
    session: Session,
    job_id: uuid.UUID,
    seen_deadline: datetime | None,
    deadline_s: float,
    data: dict[str, Any],
    *,
    republished: bool = False,
) -> bool:
    """The reaper published the job's stage again; conditional on nobody having moved it since."""
    values: dict[str, Any] = {
        "recoveries": Job.recoveries + 1,
        "deadline_at": utcnow() + timedelta(seconds=deadline_s),
    }
    if republished:
        values["published_at"] = utcnow()
    same = Job.deadline_at.is_(None) if seen_deadline is None else Job.deadline_at == seen_deadline
    return _transition(
        session,
        job_id,
        and_(Job.status.in_(ACTIVE), same),
        values,
        "job.recovered",
        event_data=data,
    )


def mark_compensated(session: Session, job_id: uuid.UUID, data: dict[str, Any]) -> bool:
    """Claim the job's compensation: True exactly once per failed or canceled job."""
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
    session.add(JobEvent(job_id=job_id, type="job.compensated", data=data))
    return True
