"""Retention and deletion: when a finished job's data expires, and marking it removed (row kept for usage)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from models.base import utcnow
from models.db import rowcount
from models.job import TERMINAL, Job


def expires_at(job: Job, retention_s: int | None) -> datetime | None:
    """When the finished job's data goes: completed_at + retention_s; None while active or kept forever."""
    if not retention_s or job.completed_at is None or job.status not in TERMINAL:
        return None
    return job.completed_at + timedelta(seconds=retention_s)


def lock_expired(
    session: Session, retention_s: int, limit: int, now: datetime | None = None
) -> list[uuid.UUID]:
    """Up to `limit` expired jobs whose data is still there, oldest first, row-locked until commit.

    SKIP LOCKED: a second retention run at the same moment takes other jobs, never the same ones.
    """
    cutoff = (now or utcnow()) - timedelta(seconds=retention_s)
    stmt = (
        select(Job.id)
        .where(Job.data_removed_at.is_(None), Job.completed_at.is_not(None), Job.completed_at < cutoff)
        .where(Job.status.in_(TERMINAL))
        .order_by(Job.completed_at)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    return list(session.scalars(stmt))


def mark_removed(session: Session, job_ids: Sequence[uuid.UUID]) -> int:
    """Finished jobs' outputs and prompt gone, never a cache source again; returns how many were marked.

    The accounting columns (status, timings, GPU seconds, tokens, frames, models) stay, so usage
    still counts the job. Idempotent: a job already marked is left as it is.
    """
    if not job_ids:
        return 0
    now = utcnow()
    result = session.execute(
        update(Job)
        .where(Job.id.in_(job_ids), Job.status.in_(TERMINAL), Job.data_removed_at.is_(None))
        .values(
            data_removed_at=now,
            updated_at=now,
            output_text=None,
            artifact_path=None,
            prompt="",
            cache_key=None,  # find_source looks jobs up by key: without one it is never a hit
        )
        .execution_options(synchronize_session=False)
    )
    return rowcount(result) or 0
