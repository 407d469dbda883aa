"""Engine and session factories for Postgres (psycopg 3) and SQLite (embedded mode)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, CursorResult, Engine, Result, Uuid, any_, bindparam, create_engine, event
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.elements import ColumnElement

from models import liveness


def make_engine(
    url: str,
    *,
    pool_size: int = 10,
    max_overflow: int = 10,
    connect_timeout: int = 3,
    pre_ping: bool = True,
    ping_idle_s: float = 1.0,
) -> Engine:
    """One engine per process; pool sized for the threads that share it.

    `pre_ping` tests connections on checkout so no caller sees one that died with a Postgres
    restart: those idle `ping_idle_s` or longer, or whose server sent something since their
    last use (models.liveness; 0 tests every checkout). Without it the first statement on a
    dead connection fails (the caller's error handling applies) and invalidates the whole
    pool, so each process loses one request per restart and reconnects on the next.
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # WAL lets the web thread read while a worker thread writes.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_timeout=connect_timeout,
        connect_args={"connect_timeout": connect_timeout},
    )
    if pre_ping:
        liveness.install(engine, ping_idle_s)
    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work commits on success and rolls back on any error."""
    with factory() as session, session.begin():
        yield session


@contextmanager
def autocommit(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session in autocommit: each statement is one round trip that commits on its own, with
    no BEGIN before it nor COMMIT/ROLLBACK after. For reads, and for a write that is a single
    statement (atomic by itself)."""
    with factory() as session:
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        yield session


T = TypeVar("T")
ALONE = "genqueue.alone"  # Session.info key: the session is alone()'s first try, in autocommit


class NeedsTransaction(Exception):
    """A write tried alone needs statements beside it (or wrote nothing): run the work in a transaction."""


def alone(factory: sessionmaker[Session], work: Callable[[Session], T], *, likely: bool = True) -> T:
    """`work(session)` with its one write committing by itself (autocommit: no BEGIN or COMMIT
    round trips, a third of a short transaction's client CPU and two thirds of Postgres's), or,
    when that write needs more beside it, `work` again in a transaction.

    The write decides: a models.states transition on an `alone` session writes only if nothing
    else must commit with it (outbox rows, cache followers), and raises NeedsTransaction, having
    written nothing, when it would need them or did not happen. So `work` must make that
    transition its first write and write nothing after it but what the transition allows (its
    after-commit hooks run: the session is committed). Postgres only; elsewhere the transaction.
    `likely` False (models.states.may_commit_alone): straight to the transaction, no try alone.
    """
    bind = factory.kw.get("bind")
    if likely and bind is not None and bind.dialect.name == "postgresql":
        try:
            with factory() as session:
                session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
                session.info[ALONE] = True
                result = work(session)
                session.commit()  # no round trip in autocommit; runs the after_commit hooks
                return result
        except NeedsTransaction:
            pass
    with transaction(factory) as session:
        return work(session)


def is_alone(session: Session) -> bool:
    """Whether `session` is alone()'s first try (see alone)."""
    return bool(session.info.get(ALONE))


# Reads: statements see what was committed when each began, as in a READ COMMITTED transaction.
read_only = autocommit


@contextmanager
def read_only_connection(engine: Engine) -> Iterator[Connection]:
    """A pooled connection in autocommit, without a Session: for a hot read that loads no ORM
    objects (GET /v1/jobs/{id})."""
    with engine.connect() as conn:
        yield conn.execution_options(isolation_level="AUTOCOMMIT")


def rowcount(result: Result[Any]) -> int:
    """The rows an UPDATE/DELETE matched. Session.execute is typed as returning any Result; for
    such a statement it is a CursorResult, which has the count."""
    return cast("CursorResult[Any]", result).rowcount


def among(column: Any, name: str, on_postgres: bool) -> ColumnElement[bool]:
    """`column` among the uuids bound as `name` (a list): on Postgres one uuid[] parameter (`= ANY`),
    elsewhere an IN list. An IN list of hundreds of placeholders cost SQLAlchemy and psycopg more
    CPU to render and parse than the statement's own work."""
    if on_postgres:
        return cast("ColumnElement[bool]", column == any_(bindparam(name, type_=ARRAY(Uuid))))
    return cast("ColumnElement[bool]", column.in_(bindparam(name, expanding=True)))
