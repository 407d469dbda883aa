"""A transition's UPDATE statement, built once per shape with its values bound per call.

Building a transition's `update(Job).where(...).values(...)` anew for every call, and then its
cache key for SQLAlchemy's compiled cache, was about a tenth of a pipeline worker's CPU samples
(`coercions.expect`, cache-key generation, `case()`/`BindParameter` construction; py-spy on
`python -m bench.pipeline`). A transition that names its `shape` gets one statement object per
shape and set of SET keys, kept for the process: the WHERE clause and the SQL expressions of its
SET are those of the shape's first call, and each call binds its own values (its job id, the
plain values of its SET, the parameters of its `Bound` expressions). The shape's owner promises
that nothing else differs between its calls. Unshaped transitions are built per call, as before.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ClauseElement, ColumnElement, Update, bindparam, update

from models.base import utcnow
from models.job import Job


@dataclass(frozen=True)
class Bound:
    """A SET value computed in SQL from per-call values: `build()` makes the expression with
    bind parameters named by the keys of `params` (the same expression for the same `key`)."""

    key: str
    build: Callable[[], ColumnElement[Any]]
    params: Mapping[str, Any]

    def inline(self) -> ColumnElement[Any]:
        """The expression with this call's values in it (for a statement built for one call)."""
        return self.build().params(dict(self.params))


Returning = tuple[Any, ...]  # what the UPDATE returns (entities, columns), fixed per shape
_memo: dict[Hashable, Update] = {}
_memo_lock = threading.Lock()


def _is_sql(value: Any) -> bool:
    """An SQL expression (a column attribute such as `Job.stage` included), not a plain value."""
    return isinstance(value, ClauseElement) or hasattr(value, "__clause_element__")


def _kind(value: Any) -> Hashable:
    if isinstance(value, Bound):
        return ("bound", value.key)
    return "sql" if _is_sql(value) else "value"


def _param(key: str) -> str:
    return f"set_{key}"


def _build(
    job_id: Any, where: ColumnElement[bool], sets: dict[str, Any], returning: Returning, row: bool
) -> Update:
    stmt = update(Job).where(Job.id == job_id, where).values(**sets)
    stmt = stmt.execution_options(synchronize_session=False)
    if row:  # the transition reads the row it left: the identity map must not keep stale values
        stmt = stmt.execution_options(populate_existing=True)
    return stmt.returning(*returning) if returning else stmt


def statement(
    job_id: uuid.UUID,
    where: ColumnElement[bool],
    values: dict[str, Any],
    *,
    shape: Hashable | None = None,
    returning: Returning = (),
) -> tuple[Update, dict[str, Any]]:
    """The UPDATE of one job (`updated_at` set too) and the parameters to execute it with."""
    values = {"updated_at": utcnow(), **values}
    if shape is None:
        inline = {k: v.inline() if isinstance(v, Bound) else v for k, v in values.items()}
        return _build(job_id, where, inline, returning, bool(returning)), {}
    key = (shape, tuple((k, _kind(v)) for k, v in values.items()), len(returning))
    return _memoized(key, job_id, where, values, returning), _params(job_id, values)


def _memoized(
    key: Hashable, job_id: uuid.UUID, where: ColumnElement[bool], values: dict[str, Any], returning: Returning
) -> Update:
    stmt = _memo.get(key)
    if stmt is None:
        sets = {
            k: v.build() if isinstance(v, Bound) else v if _is_sql(v)
            else bindparam(_param(k), type_=getattr(Job, k).type)
            for k, v in values.items()
        }  # fmt: skip
        job = bindparam("transition_job_id", type_=Job.id.type)
        stmt = _build(job, where, sets, returning, bool(returning))
        with _memo_lock:
            stmt = _memo.setdefault(key, stmt)
    return stmt


def _params(job_id: uuid.UUID, values: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {"transition_job_id": job_id}
    for k, v in values.items():
        if isinstance(v, Bound):
            params.update(v.params)
        elif not _is_sql(v):
            params[_param(k)] = v
    return params
