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
from datetime import datetime
from typing import Any, Literal

from pydantic import Field
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from models.base import utcnow
from models.job import JobEvent as EventRow
from models.resource import Resource

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


def after(session: Session, job_id: uuid.UUID, after_id: int = 0, limit: int = 100) -> Sequence[EventRow]:
    """The job's stored events with id > after_id, oldest first, at most `limit`."""
    stmt = (
        select(EventRow)
        .where(EventRow.job_id == job_id, EventRow.id > after_id)
        .order_by(EventRow.id)
        .limit(limit)
    )
    return session.scalars(stmt).all()


class JobEvent(Resource):
    id: int | None = Field(description="Monotonic per deployment; null on an ephemeral progress event.")
    type: str = Field(description="`job.started`, `job.progress`, `job.text.completed`, `job.succeeded`, ...")
    from_status: str | None
    to_status: str | None
    stage: str | None
    data: dict[str, Any] = Field(description="Type-specific: `progress` (0-100), error `code`, ...")
    created_at: str


class JobEventList(Resource):
    object: Literal["list"]
    data: list[JobEvent]
    has_more: bool
    next_after: int = Field(description="Pass as `after` for the next page (the last id seen).")


def _utc(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _model(event: EventRow) -> JobEvent:
    return JobEvent(
        id=event.id,
        type=event.type,
        from_status=event.from_status,
        to_status=event.to_status,
        stage=event.stage,
        data=event.data or {},
        created_at=_utc(event.created_at),
    )


def public(event: EventRow) -> dict[str, Any]:
    """The event as the API shows it."""
    return _model(event).public()


def progress_event(progress: int, stage: str | None) -> dict[str, Any]:
    """An ephemeral progress event: shaped like a stored one, without an id (not replayed)."""
    event = JobEvent(
        id=None,
        type="job.progress",
        from_status=None,
        to_status=None,
        stage=stage,
        data={"progress": progress},
        created_at=_utc(utcnow()),
    )
    return event.public()


def page(rows: Sequence[EventRow], after_id: int, has_more: bool) -> dict[str, Any]:
    """A JSON page of stored events; `next_after` is the last id in it (else the cursor given)."""
    next_after = rows[-1].id if rows else after_id
    data = [_model(e) for e in rows]
    return JobEventList(object="list", data=data, has_more=has_more, next_after=next_after).public()
