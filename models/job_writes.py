"""A new job's rows: the submit path's Core INSERTs (one job, or many in one statement) and the
published marks the API records in batches. The state machine's transitions are models.states'."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from pydantic_core import to_json
from sqlalchemy import bindparam, inspect, update
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session
from sqlalchemy.orm.instrumentation import manager_of_class

from models.base import utcnow
from models.db import among, rowcount
from models.job import Job, JobStatus, job_columns


@cache
def _mark_many_stmt(on_postgres: bool) -> Any:
    return (
        update(Job)
        .where(
            among(Job.id, "ids", on_postgres),
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


@cache
def _columns() -> tuple[dict[str, None], frozenset[str]]:
    """Every column attribute set to None, and the attributes a new job must be given (NOT NULL)."""
    required = frozenset(p.key for p in inspect(Job).column_attrs if not p.columns[0].nullable)
    return dict.fromkeys(attr for attr, _ in job_columns()), required


def new_job(**values: Any) -> Job:
    """A transient Job holding `values`, every other column None, for insert_new / insert_many.

    Built without the ORM's per-attribute events: the submit path builds up to 500 per request
    and reads every column back for the answer, and an attribute never set costs the ORM a
    default lookup on every read (construction and reads were about a tenth of a batch's web
    CPU). No column default applies here: give every NOT NULL column (a missing one raises).
    """
    unset, required = _columns()
    if missing := required - values.keys():
        raise TypeError(f"new_job() needs {', '.join(sorted(missing))}")
    job: Job = _new_instance()()
    job.__dict__.update(unset)
    job.__dict__.update(values)
    return job


@cache
def _new_instance() -> Callable[[], Any]:
    return manager_of_class(Job).new_instance  # an instance with its ORM state and nothing set


def _present(job: Job, attr: str) -> bool:
    # Left out of an INSERT, a nullable column without a database default is NULL all the same.
    return job.__dict__.get(attr) is not None


def insert_new(session: Session, job: Job) -> None:
    """One Core INSERT of a new, fully populated job (new_job), bypassing the unit of work (the
    submit hot path: several times cheaper in CPU). `job` stays transient."""
    values = {col: job.__dict__[attr] for attr, col in job_columns() if _present(job, attr)}
    session.execute(Job.__table__.insert(), [values])


def insert_many(session: Session, jobs: Sequence[Job]) -> None:
    """insert_new for many jobs (new_job), in one INSERT.

    On Postgres: `INSERT ... SELECT * FROM unnest(<one array per column>)`, a statement of one
    parameter per column whatever the number of rows, so neither SQLAlchemy nor psycopg parses
    and binds a statement of rows x columns placeholders (that cost most of a batch's INSERT).
    Elsewhere (SQLite): one multi-row VALUES.
    """
    states = [job.__dict__ for job in jobs]
    columns = [(attr, col) for attr, col in job_columns() if any(s.get(attr) is not None for s in states)]
    dialect = session.get_bind().dialect
    if dialect.name != "postgresql":
        rows = [{col: s.get(attr) for attr, col in columns} for s in states]
        session.execute(Job.__table__.insert(), rows)
        return
    sql, json_columns = _unnest_insert(tuple(col for _, col in columns), dialect)
    arrays = []
    for attr, col in columns:
        values = [s.get(attr) for s in states]
        if col in json_columns:  # sent as text[], cast to jsonb[] by the statement
            # pydantic's JSON writer (Rust): a quarter of json.dumps's CPU; jsonb keeps the value,
            # not the text's spacing.
            values = [None if v is None else to_json(v).decode() for v in values]
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
