"""A video job's output variants (`jobs.variants`): the slots a submit asks for, and their status updates.

`jobs.variants` is {name: {"status": pending | ready | failed, "key", "bytes", "error"}}, null when
the job asked for none. The post-processing task (tasks.variants) makes each pending one from the
job's own MP4 and records it here; a variant's failure never fails the job.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Text, cast, or_, select
from sqlalchemy.orm import Session

from models.job import Job, JobStatus
from models.states import _transition_row

PENDING, READY, FAILED = "pending", "ready", "failed"
EVENT = "job.variant.completed"  # one per variant, ready or failed; data says which and what is left
ERROR_MAX_CHARS = 500
STALL_HORIZON = timedelta(days=1)  # older jobs' pending variants are left as they are

Outcome = Literal["recorded", "not_pending", "gone"]


def slots(params: dict[str, Any]) -> dict[str, Any] | None:
    """The `variants` column of a new job: every asked variant pending; None when it asked for none."""
    names: list[str] = params.get("variants") or []
    return {name: {"status": PENDING} for name in names} or None


def pending_in(value: dict[str, Any] | None) -> list[str]:
    """The pending names of a `jobs.variants` value, in the order the job asked for them."""
    return [name for name, slot in (value or {}).items() if (slot or {}).get("status") == PENDING]


def pending(job: Job) -> list[str]:
    """The variants still to make, in the order the job asked for them."""
    return pending_in(job.variants)


def may_have_waiting(job: Job) -> bool:
    """Whether waiting_jobs can find anything for this job: variants are asked for at submit
    only, and followers attach to a job by its cache key only (models.cache)."""
    return job.variants is not None or job.cache_key is not None


def waiting_jobs(session: Session, job_id: uuid.UUID) -> list[uuid.UUID]:
    """The job and its cached followers (models.cache) that succeeded with variants to make."""
    stmt = select(Job.id, Job.variants).where(
        or_(Job.id == job_id, Job.source_job_id == job_id),
        Job.status == JobStatus.SUCCEEDED,
        Job.variants.is_not(None),
        Job.data_removed_at.is_(None),
    )
    rows = session.execute(stmt).all()
    return [jid for jid, value in rows if pending_in(value)]


def stalled(session: Session, now: datetime, stall_s: float, limit: int) -> list[uuid.UUID]:
    """Succeeded jobs (finished within the last STALL_HORIZON) with a variant still pending and no
    change for `stall_s`: their post-processing message was lost (a broker outage right after the
    success commit) or its worker died, so the reaper publishes it again."""
    stmt = (
        select(Job.id)
        .where(
            Job.status == JobStatus.SUCCEEDED,
            Job.completed_at > now - STALL_HORIZON,  # ix_jobs_finished_at bounds the scan
            Job.updated_at < now - timedelta(seconds=stall_s),
            Job.variants.is_not(None),
            Job.data_removed_at.is_(None),
            # The JSON as text, the same on Postgres (jsonb) and SQLite: a slot's status value.
            cast(Job.variants, Text).contains(f'"{PENDING}"'),
        )
        .order_by(Job.completed_at)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def record(
    session: Session,
    job_id: uuid.UUID,
    name: str,
    *,
    key: str | None = None,
    size: int | None = None,
    error: str | None = None,
) -> Outcome:
    """Mark variant `name` ready (its `key`, `size`) or failed (`error`), once, with its
    `job.variant.completed` event (data: variant, status, bytes or error, variants_pending).

    A read-modify-write of the job's one JSON value under its row lock (FOR UPDATE on Postgres;
    SQLite has one writer at a time), so two variants finishing together both stay recorded.
    "gone": the job is no longer a succeeded job with its data (deleted meanwhile); its files go.
    """
    row = session.execute(
        select(Job.status, Job.variants, Job.data_removed_at).where(Job.id == job_id).with_for_update()
    ).one_or_none()
    if row is None or row.status != JobStatus.SUCCEEDED or row.data_removed_at is not None:
        return "gone"
    current: dict[str, Any] = dict(row.variants or {})
    if (current.get(name) or {}).get("status") != PENDING:
        return "not_pending"  # a redelivery after the first recorded it
    if error is None:
        current[name] = {"status": READY, "key": key, "bytes": size}
    else:
        current[name] = {"status": FAILED, "error": error[:ERROR_MAX_CHARS]}
    # The event says what the slot now says, less the storage key (the resource has the links).
    data = {"variant": name} | {k: v for k, v in current[name].items() if k != "key"}
    data["variants_pending"] = len(pending_in(current))
    _transition_row(
        session, job_id, Job.status == JobStatus.SUCCEEDED, {"variants": current}, EVENT,
        from_status=JobStatus.SUCCEEDED, event_data=data,
    )  # fmt: skip
    return "recorded"


def fail_pending(session: Session, job_id: uuid.UUID, names: Sequence[str], error: str) -> None:
    """Give up on the variants still pending among `names` (retries spent): failed, with `error`."""
    for name in names:
        record(session, job_id, name, error=error)
