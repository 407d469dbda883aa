"""A Core statement compiled once and run on the psycopg connection beneath a SQLAlchemy Connection.

For the hot single-row statements (the poll's read, a worker's transitions), SQLAlchemy's
execution and result machinery cost as much CPU as the driver's round trip (the poll's read
0.42 -> 0.22 ms in a loop, a transition 0.56-0.66 -> 0.26-0.35 ms). Here the statement is
compiled once per dialect, the bind values go through the same bind processors SQLAlchemy
would apply, the row's values through the columns' own result processors, and a driver error
is raised as SQLAlchemy raises it (a lost server invalidates the connection: the web's error
handler and the workers' retry policy see the same transient outage). SQLAlchemy runs it
instead where the driver is not psycopg, where anything listens to the engine's statements
(`usable`: instrumentation, the tests' statement counts see every statement), and for a
statement with post-compile (expanding) parameters, an IN list that SQLAlchemy renders per call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from sqlalchemy import Connection, Dialect
from sqlalchemy.sql.expression import Select, Update

Processor = Callable[[Any], Any]
R = TypeVar("R")
_compiled: dict[tuple[Select[Any] | Update, Dialect], DriverStatement] = {}
_lock = threading.Lock()


class DriverStatement:
    """One statement compiled for one dialect: its SQL, bind processors and result columns."""

    def __init__(self, stmt: Select[Any] | Update, dialect: Dialect) -> None:
        compiled = stmt.compile(dialect=dialect)
        self.dialect, self.compiled, self.sql = dialect, compiled, compiled.string
        self.expanding = "POSTCOMPILE" in self.sql  # an IN list expanded per call: SQLAlchemy's job
        self.binds: dict[str, Processor] = {}
        self.literals: dict[str, Any] = {}  # the values written into the statement (a WHERE's)
        self.simple = True  # no computed values: the call's values and the literals are all
        for name, bind in compiled.binds.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                self.binds[name] = process
            if bind.callable is not None:
                self.simple = False
            elif not bind.required:
                self.literals[name] = bind.value
        self.columns = list(stmt.exported_columns)  # selected, or RETURNING
        self.names = [c.key or c.name for c in self.columns]
        self.results: list[Processor | None] | None = None  # chosen on the first row (driver types)

    def parameters(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The driver's parameters for one call's `values`, as SQLAlchemy would bind them."""
        if self.simple:  # what construct_params gives, without its per-call bookkeeping
            params = {**self.literals, **values}
        else:
            params = dict(self.compiled.construct_params(dict(values)))
        for name, process in self.binds.items():
            if name in params:  # None too: a JSON column's None is JSON null, as SQLAlchemy binds it
                params[name] = process(params[name])
        return params

    def row(self, cursor: psycopg.Cursor[Any], values: Sequence[Any]) -> list[Any]:
        """A fetched row's values after the columns' result processors."""
        if self.results is None:  # psycopg builds `description` anew on each access: once only
            d = self.dialect
            self.results = [
                c.type.dialect_impl(d).result_processor(d, column.type_code)
                for c, column in zip(self.columns, cursor.description or (), strict=True)
            ]
        return [v if p is None or v is None else p(v) for p, v in zip(self.results, values, strict=True)]


def compiled(stmt: Select[Any] | Update, dialect: Dialect) -> DriverStatement:
    """`stmt` compiled for `dialect`, once per statement object: for statements built once."""
    key = (stmt, dialect)
    found = _compiled.get(key)
    if found is None:
        found = DriverStatement(stmt, dialect)
        with _lock:
            found = _compiled.setdefault(key, found)
    return found


def usable(conn: Connection) -> bool:
    """Whether statements on `conn` may go to the driver directly (see the module's docstring)."""
    listened = conn.dispatch.before_cursor_execute or conn.dispatch.after_cursor_execute
    return conn.dialect.driver == "psycopg" and not listened


def first(conn: Connection, stmt: Select[Any] | Update, values: Mapping[str, Any]) -> dict[str, Any] | None:
    """The statement's first row by column name, or None; through the driver when `usable`."""
    found = _first(conn, stmt, values)
    return None if found is None else dict(zip(compiled(stmt, conn.dialect).names, found, strict=True))


def first_as(
    conn: Connection, stmt: Select[Any] | Update, values: Mapping[str, Any], make: Callable[..., R]
) -> R | None:
    """The statement's first row as `make(*values)` (a named tuple, say), or None."""
    found = _first(conn, stmt, values)
    return None if found is None else make(*found)


def _first(conn: Connection, stmt: Select[Any] | Update, values: Mapping[str, Any]) -> Sequence[Any] | None:
    run = compiled(stmt, conn.dialect)
    if run.expanding or not usable(conn):
        return conn.execute(stmt, dict(values)).first()
    params = run.parameters(values)
    try:
        with conn.connection.driver_connection.execute(run.sql, params) as cursor:  # type: ignore[union-attr]
            found = cursor.fetchone()
            return None if found is None else run.row(cursor, found)
    except BaseException as exc:  # as SQLAlchemy's execution: an interrupted call invalidates too
        # SQLAlchemy's own handling (private, but the one definition of it): the error wrapped as
        # its DBAPIError, a disconnect invalidating this connection and the pool's older ones,
        # the engine's handle_error hooks run.
        conn._handle_dbapi_exception(exc, run.sql, params, None, None)
        raise  # not reached: the handler raises
