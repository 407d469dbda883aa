"""Retention and deletion: when a finished job's data expires, and removing it (the row stays for usage)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.orm import Session

from models import plans
from models.base import utcnow
from models.job import TERMINAL, Job
from models.settings import Settings
from models.webhook import WebhookMessage


def expires_at(job: Job, retention_s: int | None) -> datetime | None:
    """When the finished job's data goes: completed_at + retention_s; None while active or kept forever."""
    if not retention_s or job.completed_at is None or job.status not in TERMINAL:
        return None
    return job.completed_at + timedelta(seconds=retention_s)


def _expired(session: Session, settings: Settings, now: datetime) -> ColumnElement[bool] | None:
    """Whose jobs are past their plan's retention: one cutoff per retention in use; None: nobody's.

    Tenants whose plan sets a retention of its own are few, so they are named; every other
    tenant's jobs follow the default (`retention_s`). 0 keeps a tenant's jobs forever.
    """
    own = plans.retention_overrides(session)
    by_retention: dict[int, list[uuid.UUID]] = {}
    for tenant, seconds in own.items():
        by_retention.setdefault(seconds, []).append(tenant)
    terms = [
        and_(Job.tenant_id.in_(tenants), Job.completed_at < now - timedelta(seconds=seconds))
        for seconds, tenants in by_retention.items()
        if seconds
    ]
    if settings.retention_s:
        default = Job.completed_at < now - timedelta(seconds=settings.retention_s)
        terms.append(and_(Job.tenant_id.not_in(list(own)), default) if own else default)
    return or_(*terms) if terms else None


def lock_expired(
    session: Session, settings: Settings, limit: int, now: datetime | None = None
) -> list[uuid.UUID]:
    """Up to `limit` jobs past their plan's retention whose data is still there, oldest first,
    row-locked until commit.

    SKIP LOCKED: a second retention run at the same moment takes other jobs, never the same ones.
    """
    expired = _expired(session, settings, now or utcnow())
    if expired is None:
        return []
    stmt = (
        select(Job.id)
        .where(Job.data_removed_at.is_(None), Job.completed_at.is_not(None), expired)
        .where(Job.status.in_(TERMINAL))
        .order_by(Job.completed_at)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(skip_locked=True)
    return list(session.scalars(stmt))


# What removal leaves of a job's data, on its row and in its webhook messages' snapshots.
REMOVED: dict[str, Any] = {
    "output_text": None,
    "artifact_path": None,
    "prompt": "",
    "cache_key": None,  # find_source looks jobs up by key: without one it is never a hit
}


def mark_removed(session: Session, job_ids: Sequence[uuid.UUID]) -> int:
    """Finished jobs' outputs and prompt gone, never a cache source again; returns how many were marked.

    The accounting columns (status, timings, GPU seconds, tokens, frames, models) stay, so usage
    still counts the job. Idempotent: a job already marked is left as it is. Their webhook
    messages are scrubbed in the same transaction (scrub_messages).
    """
    if not job_ids:
        return 0
    now = utcnow()
    marked = session.scalars(
        update(Job)
        .where(Job.id.in_(job_ids), Job.status.in_(TERMINAL), Job.data_removed_at.is_(None))
        .values(data_removed_at=now, updated_at=now, **REMOVED)
        .returning(Job.id)
        .execution_options(synchronize_session=False)
    ).all()
    scrub_messages(session, marked, now)
    return len(marked)


def scrub_messages(session: Session, job_ids: Sequence[uuid.UUID], removed_at: datetime) -> int:
    """The jobs' webhook messages lose the prompt and outputs their snapshots and bodies hold.

    A snapshot keeps everything else (status, timings, the job's own `webhook`): deliveries
    and usage bookkeeping need it. The rendered body goes: a pending delivery is rendered
    again from the scrubbed snapshot before it is sent (tasks.webhooks.send_due), so it
    still goes out, saying `data_removed: true`; a delivered one has nothing left to send.
    Returns how many messages were scrubbed.
    """
    if not job_ids:
        return 0
    rows = session.execute(
        select(WebhookMessage.id, WebhookMessage.snapshot).where(WebhookMessage.job_id.in_(job_ids))
    ).all()
    scrubbed = {**REMOVED, "data_removed_at": removed_at.isoformat(), "updated_at": removed_at.isoformat()}
    values = [{"id": id_, "snapshot": {**snap, **scrubbed}, "body": None} for id_, snap in rows]
    if values:
        session.execute(update(WebhookMessage), values)  # executemany by primary key
    return len(values)
