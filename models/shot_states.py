"""A storyboard's shot transitions: created with the text stage, entered, completed, the stitch's cue.

Same rules as models.states: conditional UPDATEs, so a redelivered or duplicated shot message
finds its shot past that point and does nothing. The completion that leaves no shot unfinished
moves the job to its stitch stage in the same transaction, with the job's row locked first:
concurrent completions of one job's shots take turns, so exactly one of them sees the set
complete (none misses it, none does it twice).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, func, select, update
from sqlalchemy.orm import Session

from models.base import utcnow
from models.db import rowcount
from models.job import Job, JobStatus, Stage
from models.job_shots import JobShot, ShotStatus
from models.states import Charge, _charge_values, _transition, _transition_row

SHOTS_FROM, SHOTS_TO = 20, 95  # the job's progress while its shots render (the stitch takes the rest)
_OPEN = (ShotStatus.QUEUED, ShotStatus.RUNNING)


def create(session: Session, job_id: uuid.UUID, descriptions: Sequence[str]) -> None:
    """The shots' rows, queued, in film order (with the text stage's completion)."""
    now = utcnow()
    rows = [
        {"job_id": job_id, "idx": i, "status": ShotStatus.QUEUED, "description": d, "updated_at": now}
        for i, d in enumerate(descriptions)
    ]
    session.execute(JobShot.__table__.insert(), rows)


def of_job(session: Session, job_id: uuid.UUID) -> list[JobShot]:
    """The job's shots in film order (none for other modalities)."""
    return list(session.scalars(select(JobShot).where(JobShot.job_id == job_id).order_by(JobShot.idx)))


def rows(conn: Session | Connection, job_id: uuid.UUID) -> list[Any]:
    """The job's shots as Core rows (the read-only answer's path: no ORM entities), film order."""
    table = JobShot.__table__
    return list(conn.execute(select(table).where(table.c.job_id == job_id).order_by(table.c.idx)))


def of_jobs(session: Session, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[JobShot]]:
    """of_job for many jobs in one query (a listing's storyboards)."""
    out: dict[uuid.UUID, list[JobShot]] = {}
    if not job_ids:
        return out
    stmt = select(JobShot).where(JobShot.job_id.in_(job_ids)).order_by(JobShot.job_id, JobShot.idx)
    for shot in session.scalars(stmt):
        out.setdefault(shot.job_id, []).append(shot)
    return out


def unfinished(session: Session, job_id: uuid.UUID) -> list[int]:
    """The indexes of the shots still to render (queued, or running when a worker died)."""
    stmt = (
        select(JobShot.idx).where(JobShot.job_id == job_id, JobShot.status.in_(_OPEN)).order_by(JobShot.idx)
    )
    return list(session.scalars(stmt))


def enter(session: Session, job_id: uuid.UUID, index: int, job_deadline: datetime) -> JobShot | None:
    """The shot starts (or a redelivery re-enters it), counted as an attempt; None when its job is
    not rendering shots or the shot is done. The job's deadline moves out: its shots are alive."""
    if not _transition(
        session, job_id, and_(Job.status == JobStatus.RUNNING, Job.stage == Stage.SHOTS),
        {"deadline_at": job_deadline}, None,
    ):  # fmt: skip
        return None
    stmt = (
        update(JobShot)
        .where(JobShot.job_id == job_id, JobShot.idx == index, JobShot.status.in_(_OPEN))
        .values(
            status=ShotStatus.RUNNING,
            attempts=JobShot.attempts + 1,
            updated_at=utcnow(),
            started_at=func.coalesce(JobShot.started_at, utcnow()),
        )
        .returning(JobShot)
        .execution_options(synchronize_session=False, populate_existing=True)
    )
    return session.execute(stmt).scalar()


def set_progress(session: Session, job_id: uuid.UUID, index: int, progress: int) -> bool:
    """A running shot's progress (forward only), and the job's as the mean of its shots'."""
    stmt = (
        update(JobShot)
        .where(
            JobShot.job_id == job_id,
            JobShot.idx == index,
            JobShot.status == ShotStatus.RUNNING,
            JobShot.progress < progress,
        )
        .values(progress=progress, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if rowcount(session.execute(stmt)) != 1:
        return False
    job_progress = _job_progress(session, job_id)
    return _transition(
        session, job_id,
        and_(Job.status == JobStatus.RUNNING, Job.stage == Stage.SHOTS, Job.progress < job_progress),
        {"progress": job_progress}, None,
    )  # fmt: skip


def _job_progress(session: Session, job_id: uuid.UUID) -> int:
    """SHOTS_FROM..SHOTS_TO by the shots' mean progress (a succeeded shot counts as 100)."""
    done = func.sum(func.coalesce(JobShot.progress, 0))
    total, count = session.execute(select(done, func.count()).where(JobShot.job_id == job_id)).one()
    if not count:
        return SHOTS_FROM
    return SHOTS_FROM + (SHOTS_TO - SHOTS_FROM) * int(total or 0) // (100 * int(count))


@dataclass(frozen=True)
class ShotDone:
    """What one shot render left: its file, size, frames, wall time and GPU charge."""

    artifact_path: str
    artifact_bytes: int
    frames: int
    seconds: float
    charge: Charge
    source_job_id: uuid.UUID | None = None  # copied from that job's identical shot (models.shot_cache)


def complete(
    session: Session, job_id: uuid.UUID, index: int, done: ShotDone, stitch_deadline: datetime
) -> tuple[bool, bool]:
    """running shot -> succeeded, its `job.shot.completed` event, and the job to its stitch stage
    when it was the last one. Returns (this call completed the shot, it moved the job on)."""
    # The job's row first: completions of one job's shots take turns from here to the commit.
    locked = session.execute(
        select(Job.id)
        .where(Job.id == job_id, Job.status == JobStatus.RUNNING, Job.stage == Stage.SHOTS)
        .with_for_update()
    ).scalar()
    if locked is None:
        return False, False
    stmt = (
        update(JobShot)
        .where(JobShot.job_id == job_id, JobShot.idx == index, JobShot.status == ShotStatus.RUNNING)
        .values(
            status=ShotStatus.SUCCEEDED,
            progress=100,
            completed_at=utcnow(),
            updated_at=utcnow(),
            artifact_path=done.artifact_path,
            artifact_bytes=done.artifact_bytes,
            frames=done.frames,
            seconds=done.seconds,
            gpu_s=func.coalesce(JobShot.gpu_s, 0.0) + round(done.charge.gpu_s, 6),
            error_code=None,
            error_message=None,
            source_job_id=done.source_job_id,
        )
        .execution_options(synchronize_session=False)
    )
    if rowcount(session.execute(stmt)) != 1:
        return False, False
    left = len(unfinished(session, job_id))
    total = session.execute(select(func.count()).where(JobShot.job_id == job_id)).scalar() or 0
    values: dict[str, Any] = {"progress": _job_progress(session, job_id)}
    values |= _charge_values(Stage.VIDEO, done.charge)  # a storyboard's shots are its video usage
    if left == 0:
        values |= {"stage": Stage.STITCH, "attempts": 0, "deadline_at": stitch_deadline}
    data = {
        "shot": index,
        "shots_completed": total - left,
        "shots": total,
        "artifact_bytes": done.artifact_bytes,
        "cached": done.source_job_id is not None,
    }
    _transition_row(
        session, job_id, Job.id == job_id, values, "job.shot.completed",
        from_status=JobStatus.RUNNING, event_data=data,
    )  # fmt: skip
    return True, left == 0


def to_stitch(session: Session, job_id: uuid.UUID, stitch_deadline: datetime) -> bool:
    """A job whose shots all succeeded but which is still in its shots stage (a fan-out resent by
    the reaper after the last shot's move was lost) goes on to its stitch; False otherwise."""
    if unfinished(session, job_id):
        return False
    return _transition(
        session, job_id,
        and_(Job.status == JobStatus.RUNNING, Job.stage == Stage.SHOTS),
        {"stage": Stage.STITCH, "attempts": 0, "deadline_at": stitch_deadline}, None,
    )  # fmt: skip


def record_failure(session: Session, job_id: uuid.UUID, index: int, code: str, message: str) -> None:
    """The shot's last error, kept on it (the job fails by models.states.fail)."""
    session.execute(
        update(JobShot)
        .where(JobShot.job_id == job_id, JobShot.idx == index, JobShot.status.in_(_OPEN))
        .values(status=ShotStatus.FAILED, error_code=code, error_message=message[:2000], updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )


def totals(shots: Sequence[JobShot]) -> tuple[float, int]:
    """The shots' render seconds and frames, added up."""
    return sum(s.seconds or 0.0 for s in shots), sum(s.frames or 0 for s in shots)
