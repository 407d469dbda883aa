"""The shot cache: a storyboard shot identical to one its tenant already rendered reuses that render.

A storyboard takes part when it would be cached as a video job would (seeded, `cache` not
false): submit gives it a `cache_key`, which marks it eligible (storyboards are not reused whole:
each has its own shot list and files). Each of its shots gets a key of its own, by the rules of
models.cache (the shot's description, its render params with its own seed, the video model's
spec and version), looked up when the shot is about to render:
- a succeeded identical shot of the tenant's, whose job is not failed or canceled: the task
  copies that MP4 under this shot's own key, so every job's files stay its own (compensation or
  retention of one never removes another's), and records where it came from;
- an identical shot still rendering (and alive): this one waits for it and looks again, so two
  storyboards submitted together render a shared shot once;
- neither: this shot claims the key and renders.
Lookups of one key take its advisory lock (models.cache), so two at once see each other's claim.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, not_, select, update
from sqlalchemy.orm import Session

from models import cache
from models.base import utcnow
from models.job import Job, JobStatus
from models.job_shots import JobShot, ShotStatus
from models.settings import Settings

# A shot's render params that can change its frames (its prompt is its description).
RENDER_PARAMS = ("width", "height", "num_frames", "fps", "steps", "seed", "guidance_scale")


def shot_key(settings: Settings, description: str, render: dict[str, Any], model_id: str) -> str:
    """The shot's cache key: models.cache.cache_key over what makes its frames (settings: the
    catalog with the hot swaps in effect, as the render will see it)."""
    params = {k: render[k] for k in RENDER_PARAMS if k in render}
    return cache.cache_key(settings, "shot", description, params, {"video": model_id})


@dataclass(frozen=True)
class Source:
    """An identical shot already rendered: its job, place and file."""

    job_id: uuid.UUID
    index: int
    artifact_path: str
    artifact_bytes: int
    frames: int


@dataclass(frozen=True)
class Lookup:
    """What a shot about to render found for its key: a source to copy, or one being rendered."""

    source: Source | None
    busy: bool


def _tenant(tenant_id: uuid.UUID | None) -> ColumnElement[bool]:
    # Only the tenant's own shots are reused, as for jobs (models.cache.find_source).
    return Job.tenant_id == tenant_id if tenant_id is not None else Job.tenant_id.is_(None)


def lookup(
    session: Session,
    key: str,
    tenant_id: uuid.UUID | None,
    job_id: uuid.UUID,
    index: int,
    alive_since: datetime,
) -> Lookup:
    """Find `key` for shot (job_id, index), and claim it when there is nothing to reuse or wait for.

    Call in a transaction; the key's lock is held to its commit. `alive_since`: an identical shot
    running but not updated since then belongs to a dead worker and is not waited for.
    """
    cache.lock_keys(session, [key])
    itself = and_(JobShot.job_id == job_id, JobShot.idx == index)
    stmt = (
        select(JobShot.job_id, JobShot.idx, JobShot.artifact_path, JobShot.artifact_bytes, JobShot.frames)
        .join(Job, Job.id == JobShot.job_id)
        .where(
            JobShot.cache_key == key,
            JobShot.status == ShotStatus.SUCCEEDED,
            JobShot.artifact_path.is_not(None),
            Job.status.in_([JobStatus.RUNNING, JobStatus.SUCCEEDED]),  # an ended job's files go
            Job.data_removed_at.is_(None),
            _tenant(tenant_id),
            not_(itself),
        )
        .order_by(JobShot.completed_at.desc())
        .limit(1)
    )
    row = session.execute(stmt).first()
    if row is not None:
        size, frames = int(row.artifact_bytes or 0), int(row.frames or 0)
        source = Source(row.job_id, row.idx, row.artifact_path, size, frames)
        return Lookup(source, busy=False)
    busy = session.execute(
        select(JobShot.job_id)
        .join(Job, Job.id == JobShot.job_id)
        .where(
            JobShot.cache_key == key,
            JobShot.status == ShotStatus.RUNNING,
            JobShot.updated_at > alive_since,
            Job.status == JobStatus.RUNNING,
            _tenant(tenant_id),
            not_(itself),
        )
        .limit(1)
    ).first()
    if busy is not None:
        return Lookup(None, busy=True)
    session.execute(
        update(JobShot).where(itself).values(cache_key=key).execution_options(synchronize_session=False)
    )
    return Lookup(None, busy=False)


def requeue(session: Session, job_id: uuid.UUID, index: int) -> None:
    """A running shot that waits for an identical one goes back to queued; the wait is no attempt."""
    session.execute(
        update(JobShot)
        .where(JobShot.job_id == job_id, JobShot.idx == index, JobShot.status == ShotStatus.RUNNING)
        .values(status=ShotStatus.QUEUED, attempts=JobShot.attempts - 1, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
