"""A job's event log as clients read it, and the notifications that announce new events.

Stored events (job_events rows) are the replayable ones: their ids are monotonic, so a
client that saw id N asks for id > N and misses nothing. Progress between them is
ephemeral: each progress write sends a notification carrying the new value, which a
stream passes on and a replay does not repeat (the job resource's `progress` has it).

Notifications are Postgres NOTIFYs sent inside the writing transaction: Postgres delivers
them only when (and if) it commits, so a listener never hears of a row it cannot read yet,
and a rolled-back transition announces nothing. A notification only says "look again":
listeners read the rows by id from the database, the one source of truth.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from models.job import JobEvent

CHANNEL = "genqueue_job_events"
TERMINAL_EVENTS = frozenset({"job.succeeded", "job.failed", "job.canceled"})
_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


def notify(session: Session, job_id: uuid.UUID, progress: int | None = None) -> None:
    """Announce, on commit, that `job_id` has new events (or reached `progress`); no-op off Postgres."""
    if session.get_bind().dialect.name != "postgresql":
        return
    payload = str(job_id) if progress is None else f"{job_id} {progress}"
    session.execute(_NOTIFY, {"channel": CHANNEL, "payload": payload})


def parse(payload: str) -> tuple[uuid.UUID, int | None] | None:
    """(job id, progress or None) from a notification's payload; None if it is not one of ours."""
    head, _, tail = payload.partition(" ")
    try:
        return uuid.UUID(head), int(tail) if tail else None
    except ValueError:
        return None


def after(session: Session, job_id: uuid.UUID, after_id: int = 0, limit: int = 100) -> Sequence[JobEvent]:
    """The job's stored events with id > after_id, oldest first, at most `limit`."""
    stmt = (
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.id > after_id)
        .order_by(JobEvent.id)
        .limit(limit)
    )
    return session.scalars(stmt).all()


def public(event: JobEvent) -> dict[str, Any]:
    """The event as the API shows it."""
    return {
        "id": event.id,
        "type": event.type,
        "from_status": event.from_status,
        "to_status": event.to_status,
        "stage": event.stage,
        "data": event.data or {},
        "created_at": event.created_at.isoformat().replace("+00:00", "Z"),
    }
