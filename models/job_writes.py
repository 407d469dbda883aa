"""A new job's rows: the submit path's Core INSERTs (one job, or many in one statement) and the
published marks the API records in batches. The state machine's transitions are models.states'."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Uuid, any_, bindparam, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from models.base import utcnow
from models.db import rowcount
from models.job import Job, JobStatus, job_columns


@cache
def _mark_many_stmt(as_array: bool) -> Any:
    # On Postgres the ids go as one uuid[] parameter (`= ANY`): an IN list of hundreds of
    # placeholders cost SQLAlchemy and psycopg more CPU to render and parse than the UPDATE itself.
    ids = bindparam("ids", type_=ARRAY(Uuid)) if as_array else bindparam("ids", expanding=True)
    return (
        update(Job)
        .where(
            Job.id == any_(ids) if as_array else Job.id.in_(ids),
            Job.status == JobStatus.QUEUED,
            Job.published_at.is_(None),
        )
        .values(published_at=bindparam("at"), updated_at=bindparam("at"))
        .execution_options(synchronize_session=False)
    )


def mark_published_many(session: Session, job_ids: list[uuid.UUID], at: datetime | None = None) -> int:
    """mark_published for many jobs in one UPDATE (the API records its publishes in batches)."""
    if not job_ids:
        return 0
    stmt = _mark_many_stmt(session.get_bind().dialect.name == "postgresql")
    result = session.execute(stmt, {"ids": job_ids, "at": at or utcnow()})
    return rowcount(result) or 0


def insert_new(session: Session, job: Job) -> None:
    """One Core INSERT of a new, fully populated job, bypassing the unit of work (the submit hot
    path: several times cheaper in CPU). `job` stays transient; set created_at/updated_at on it."""
    values = {col: getattr(job, attr) for attr, col in job_columns() if attr in job.__dict__}
    session.execute(Job.__table__.insert(), [values])


def insert_many(session: Session, jobs: Sequence[Job]) -> None:
    """insert_new for many jobs, built alike (the same attributes set), in one INSERT.

    On Postgres: `INSERT ... SELECT * FROM unnest(<one array per column>)`, a statement of one
    parameter per column whatever the number of rows, so neither SQLAlchemy nor psycopg parses
    and binds a statement of rows x columns placeholders (that cost most of a batch's INSERT).
    Elsewhere (SQLite): one multi-row VALUES.
    """
    columns = [(attr, col) for attr, col in job_columns() if attr in jobs[0].__dict__]
    dialect = session.get_bind().dialect
    if dialect.name != "postgresql":
        rows = [{col: getattr(job, attr) for attr, col in columns} for job in jobs]
        session.execute(Job.__table__.insert(), rows)
        return
    sql, json_columns = _unnest_insert(tuple(col for _, col in columns), dialect)
    arrays = []
    for attr, col in columns:
        values = [getattr(job, attr) for job in jobs]
        if col in json_columns:  # sent as text[], cast to jsonb[] by the statement
            values = [None if v is None else json.dumps(v) for v in values]
        arrays.append(values)
    session.connection().exec_driver_sql(sql, tuple(arrays))


@cache
def _unnest_insert(columns: tuple[str, ...], dialect: Dialect) -> tuple[str, frozenset[str]]:
    """The INSERT ... unnest statement for these columns (psycopg placeholders) and its JSON columns."""
    table = Job.__table__
    types = {col: table.c[col].type.compile(dialect=dialect) for col in columns}
    json_columns = frozenset(col for col, t in types.items() if t in ("JSON", "JSONB"))
    names = ", ".join(f'"{col}"' for col in columns)
    # %b: psycopg sends each array in binary; as text it escaped every element with a regex, a
    # seventh of a batch's CPU (0.025 -> 0.001 ms per row for seven columns, measured).
    arrays = ", ".join(f"%b::{types[col]}[]" for col in columns)
    return f"INSERT INTO jobs ({names}) SELECT * FROM unnest({arrays})", json_columns
