"""The webhook outbox: events become outbox rows in the transition's transaction; commits wake a dispatcher.

A state change and the webhook message that reports it commit together, so a crash
after the commit loses nothing: the message waits in `webhook_messages` until a
dispatcher (woken right after the commit, or by the periodic relay) fans it out.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import ColumnElement, DateTime, Uuid, event
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.types import TypeDecorator

from models import events as job_events
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


def add_events(
    session: Session, job: Job, events: Sequence[dict[str, Any]], registered: bool | None = None
) -> None:
    """Insert `events` (job_events column values) for `job`, and their outbox messages if wanted.

    Core INSERTs, not the unit of work: the transition hot path writes one or two events per
    statement with a fraction of the CPU. Messages are written when the job has its own webhook
    or its tenant registered an endpoint. `registered`: that endpoint check, when the caller
    read it in the statement that wrote the job (registered_column); None looks it up here.
    """
    events_table = JobEvent.__table__
    job_events.notify(session, job.id)  # delivered on commit: the job's streams read the new rows
    if job.webhook is None and registered is None:
        registered = any_registered_endpoint(session, job.tenant_id)
    if not wanted(job, bool(registered)):
        session.execute(events_table.insert(), list(events))
        return
    # A message's id is its event's: RETURNING them in the order of `events`.
    stmt = events_table.insert().returning(events_table.c.id, sort_by_parameter_order=True)
    ids = session.execute(stmt, list(events)).scalars().all()
    written = [(id_, ev["type"], ev["created_at"]) for id_, ev in zip(ids, events, strict=True)]
    add_messages(session, job, written)


def wanted(job: Job, registered: bool) -> bool:
    """Whether `job`'s events become outbox messages: it has its own webhook, or its tenant a
    registered endpoint (`registered`, registered_column's answer)."""
    return job.webhook is not None or registered


def add_messages(session: Session, job: Job, events: Sequence[tuple[int, str, datetime]]) -> None:
    """The outbox messages of `job`'s written events (id, type, time), woken after the commit."""
    state = snapshot(job)
    messages = [
        # A message's id is its event's; the event's time is the payload's timestamp.
        {"id": id_, "job_id": job.id, "type": type_, "snapshot": state, "created_at": at}
        for id_, type_, at in events
    ]
    session.execute(WebhookMessage.__table__.insert(), messages)
    session.info.setdefault(_PENDING, set()).add(job.id)


def registered_column(session: Session) -> ColumnElement[bool] | None:
    """For the RETURNING of a statement on a job: does its tenant have a registered endpoint?

    None on SQLite, whose RETURNING clause is written without table names, so the subquery
    would not be tied to the job's row: add_events() asks with a query of its own there.
    """
    if session.get_bind().dialect.name != "postgresql":
        return None
    return registered_exists()


@cache
def registered_exists() -> ColumnElement[bool]:
    # Built once: the same expression every time, and its cache key is memoized with it.
    return registered_endpoint_exists(Job.tenant_id)


# Whether each tenant had a registered endpoint when a transition of one of its jobs last read
# it, in this process: a hint for models.db.alone's callers (a transition tried alone that would
# need outbox rows writes nothing and costs a round trip); the statement's own guard decides.
_endpoints_seen: dict[uuid.UUID, bool] = {}
MAX_TENANTS_SEEN = 10_000


def saw_endpoint(tenant_id: uuid.UUID, registered: bool) -> None:
    if len(_endpoints_seen) >= MAX_TENANTS_SEEN and tenant_id not in _endpoints_seen:
        _endpoints_seen.clear()  # a hint: forgetting costs a round trip per tenant, never a message
    _endpoints_seen[tenant_id] = registered


def endpoint_seen(tenant_id: uuid.UUID) -> bool:
    """Whether the tenant had a registered endpoint when last seen here (False if never seen)."""
    return _endpoints_seen.get(tenant_id, False)


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
