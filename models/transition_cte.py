"""A shaped transition as one Postgres statement: the UPDATE, its event rows and the notification.

The transition path of a worker was five round trips and as many SQLAlchemy executions per
transaction (BEGIN, the ORM `UPDATE ... RETURNING`, the events' `INSERT`, `pg_notify`, COMMIT):
0.76-0.81 ms of the worker's CPU for a `start_text` in a loop. Here the UPDATE is a
data-modifying CTE whose row feeds the events' `INSERT ... SELECT` and the notification in the
same statement (0.33-0.37 ms), executed as Core (no ORM bulk-update path, whose statement copy
got a new cache key on every call) and its row made into a detached `Job`. Used only where it
changes nothing a caller can see (`applies`): Postgres, and a session that holds no objects, so
there is no loaded `Job` whose attributes the ORM path would have refreshed and nothing pending
that it would have flushed first.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Hashable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    String,
    Text,
    Update,
    bindparam,
    cast,
    func,
    insert,
    inspect,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by
from sqlalchemy.orm import Session, make_transient_to_detached

from models import driver_sql
from models.base import JSONType
from models.events import CHANNEL
from models.job import Job, JobEvent, job_columns
from models.transition_sql import statement

_MAPPER = inspect(Job)
_TABLE = Job.__table__
_COLUMNS = tuple(_TABLE.c)
_EVENT_COLUMNS = ["job_id", "type", "from_status", "to_status", "stage", "data", "created_at"]
_memo: dict[Update, Select[Any]] = {}
_memo_lock = threading.Lock()


def applies(session: Session, values: dict[str, Any]) -> bool:
    """Whether the one-statement path gives what the ORM path would (see the module's docstring)."""
    if session.get_bind().dialect.name != "postgresql" or len(session.identity_map) or session.new:
        return False
    status = values.get("status")  # the event's to_status is a value, never an expression
    return status is None or isinstance(status, str)


def detached(values: Mapping[str, Any]) -> Job:
    """A detached Job holding the row's values (by column name), as a committed session with
    expire_on_commit=False leaves one: attributes read without loading, and `session.add`
    attaches it, never inserts."""
    job: Job = _MAPPER.class_manager.new_instance()
    job.__dict__.update({attr: values[column] for attr, column in job_columns()})
    make_transient_to_detached(job)  # its identity from the primary key; no attribute expired
    return job


def without_events(
    session: Session, job_id: uuid.UUID, where: ColumnElement[bool], values: dict[str, Any], shape: Hashable
) -> Job | None:
    """The transition, no event: the job as it left, or None when the WHERE matched nothing."""
    stmt, params = statement(job_id, where, values, shape=("row", shape), returning=_COLUMNS)
    row = driver_sql.first(session.connection(), stmt, params)
    return None if row is None else detached(row)


def with_events(
    session: Session,
    job_id: uuid.UUID,
    where: ColumnElement[bool],
    values: dict[str, Any],
    names: Sequence[str],
    *,
    shape: Hashable,
    registered: ColumnElement[bool],
    from_status: str | None,
    data: dict[str, Any],
    at: datetime,
) -> tuple[Job, list[tuple[int, str]], bool] | None:
    """The transition and one event row per name (in order, each with `data`), notified on commit.

    Returns the job as it left, its events' (id, type) in order and whether its tenant has a
    registered webhook endpoint (`registered`, read in the same statement); None when the WHERE
    matched nothing (no event written, nothing notified)."""
    returning = (*_COLUMNS, registered.label("gq_registered"))
    update, params = statement(job_id, where, values, shape=("events", shape), returning=returning)
    params |= {"ev_types": list(names), "ev_from": from_status, "ev_to": values.get("status")}
    params |= {"ev_data": data, "ev_at": at, "ev_channel": CHANNEL}
    row = driver_sql.first(session.connection(), _around(update), params)
    if row is None:
        return None
    events = list(zip(row["gq_event_ids"], row["gq_event_types"], strict=True))
    # Postgres numbers the rows of an INSERT ... SELECT ... ORDER BY in that order; if it ever
    # did not, the messages (each paired with its own event) would go out of order: fail loudly.
    assert [type_ for _, type_ in events] == list(names), events
    return detached(row), events, bool(row["gq_registered"])


def _around(update: Update) -> Select[Any]:
    """`update` (memoized per shape) with the events' INSERT and the notification around it."""
    stmt = _memo.get(update)
    if stmt is None:
        moved = update.cte("moved")
        names = func.unnest(bindparam("ev_types", type_=ARRAY(String)))
        name = names.table_valued("type", with_ordinality="n").render_derived(name="e")
        rows = (
            select(
                moved.c.id,
                name.c.type,
                bindparam("ev_from", type_=String),
                bindparam("ev_to", type_=String),
                moved.c.stage,  # the stage the job is in after the UPDATE, as the ORM path recorded
                bindparam("ev_data", type_=JSONType),
                bindparam("ev_at", type_=JobEvent.__table__.c.created_at.type),
            )
            .select_from(moved)
            .join(name, moved.c.id.is_not(None))
            .order_by(name.c.n)  # ids in the order of the names: a message's id is its event's
        )
        written = (
            insert(JobEvent.__table__)
            .from_select(_EVENT_COLUMNS, rows)
            .returning(JobEvent.__table__.c.id, JobEvent.__table__.c.type)
            .cte("written")
        )
        ids = select(func.array_agg(aggregate_order_by(written.c.id, written.c.id))).scalar_subquery()
        types = select(func.array_agg(aggregate_order_by(written.c.type, written.c.id))).scalar_subquery()
        # Delivered on commit, the payload events.notify's (the id as text; events.parse reads it).
        notified = func.pg_notify(bindparam("ev_channel", type_=String), cast(moved.c.id, Text))
        stmt = select(
            moved, ids.label("gq_event_ids"), types.label("gq_event_types"), notified.label("gq_notified")
        )
        with _memo_lock:
            stmt = _memo.setdefault(update, stmt)
    return stmt
