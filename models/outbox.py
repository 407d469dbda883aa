"""The webhook outbox: events become outbox rows in the transition's transaction; commits wake a dispatcher.

A state change and the webhook message that reports it commit together, so a crash
after the commit loses nothing: the message waits in `webhook_messages` until a
dispatcher (woken right after the commit, or by the periodic relay) fans it out.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, DateTime, Uuid, event
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.types import TypeDecorator

from models.base import utcnow
from models.job import Job, JobEvent
from models.webhook import WebhookMessage, any_registered_endpoint, registered_endpoint_exists

log = logging.getLogger("genqueue.webhooks")

_PENDING = "genqueue.outbox.pending"  # session.info key: jobs with messages in this transaction
# (attribute, column type), TypeDecorators unwrapped to the type they store as.
_ATTRS = [
    (a.key, t.impl if isinstance(t, TypeDecorator) else t)
    for a in sa_inspect(Job).column_attrs
    for t in [a.columns[0].type]
]


def snapshot(job: Job) -> dict[str, Any]:
    """The job row as plain JSON values (datetimes ISO 8601, UUIDs as strings)."""
    out: dict[str, Any] = {}
    for key, _ in _ATTRS:
        value = getattr(job, key)
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, uuid.UUID):
            value = str(value)
        out[key] = value
    return out


def job_from_snapshot(data: dict[str, Any]) -> Job:
    """A transient Job equal to the snapshotted row, for models.resource.job_resource."""
    values: dict[str, Any] = {}
    for key, type_ in _ATTRS:
        if key not in data:
            continue  # a column added after the snapshot was taken keeps its default
        value = data[key]
        if value is not None and isinstance(type_, DateTime):
            value = datetime.fromisoformat(value)
        elif value is not None and isinstance(type_, Uuid):
            value = uuid.UUID(value)
        values[key] = value
    return Job(**values)


def record(session: Session, job: Job, ev: JobEvent, registered: bool | None = None) -> None:
    """Queue `ev` for webhooks if the job has its own webhook or its tenant registered an endpoint.

    `registered`: whether the tenant has an endpoint, when the caller already read it in the
    statement that wrote the job (registered_column); None looks it up here.
    """
    if job.webhook is None:
        if registered is None:
            registered = any_registered_endpoint(session, job.tenant_id)
        if not registered:
            return
    stamp = ev.created_at or utcnow()  # the event's time is the payload's timestamp
    message = WebhookMessage(event=ev, job_id=job.id, type=ev.type, snapshot=snapshot(job), created_at=stamp)
    session.add(message)
    session.info.setdefault(_PENDING, set()).add(job.id)


def registered_column(session: Session) -> ColumnElement[bool] | None:
    """For the RETURNING of a statement on a job: does its tenant have a registered endpoint?

    None on SQLite, whose RETURNING clause is written without table names, so the subquery
    would not be tied to the job's row: record() asks with a query of its own there.
    """
    if session.get_bind().dialect.name != "postgresql":
        return None
    return registered_endpoint_exists(Job.tenant_id)


Notify = Callable[[Iterable[uuid.UUID]], None]


def on_commit(sessions: sessionmaker[Session], notify: Notify) -> None:
    """After each commit of a session from `sessions`, call `notify(job_ids)` for its new messages.

    `notify` must not raise; if it fails (broker down, process killed) the relay finds the rows.
    """

    def _after_commit(session: Session) -> None:
        jobs = session.info.pop(_PENDING, None)
        if jobs:
            try:
                notify(jobs)
            except Exception:
                log.exception("webhook dispatch not published; the relay will pick it up")

    def _after_rollback(session: Session) -> None:
        session.info.pop(_PENDING, None)

    event.listen(sessions, "after_commit", _after_commit)
    event.listen(sessions, "after_rollback", _after_rollback)
