"""Pessimistic disconnect handling that pings a pooled connection only when it may have died."""

from __future__ import annotations

import select
import time
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.exc import DisconnectionError, InvalidatePoolError
from sqlalchemy.pool import ConnectionPoolEntry

_CHECKED_IN = "genqueue.checked_in_at"  # connection record info key: time.monotonic() at checkin


def install(engine: Engine, idle_s: float) -> None:
    """Test a connection on checkout when it sat idle `idle_s` or longer, or when the server sent
    it something while it was idle.

    pool_pre_ping pays a round trip on every checkout (several per task). A Postgres shutdown or
    pg_terminate_backend sends the client an error and closes the socket, which then polls
    readable: a connection back in use within `idle_s` is pinged exactly when that happened.
    The clock covers what leaves no trace on the socket (a host or network gone silently).
    A failed ping raises InvalidatePoolError, as pool_pre_ping does: the pool replaces every
    connection as old as this one and retries the checkout on a fresh connection.
    """
    dialect = engine.dialect

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        if dbapi_conn is not None:  # None: invalidated; the next checkout connects afresh
            record.info[_CHECKED_IN] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        since = record.info.get(_CHECKED_IN)
        if since is None:
            return  # connected just now (the pool clears info on reconnect)
        if time.monotonic() - since < idle_s and not _readable(dbapi_conn):
            return
        try:
            dialect.do_ping(dbapi_conn)
        except dialect.loaded_dbapi.Error as err:
            if dialect.is_disconnect(err, dbapi_conn, None):
                raise InvalidatePoolError(f"ping failed: {err}") from err
            raise DisconnectionError(f"ping failed: {err}") from err


def _readable(dbapi_conn: Any) -> bool:
    """Whether an idle connection's socket has input (an error, EOF, a notice): one syscall."""
    try:
        fd = dbapi_conn.fileno()
    except Exception:  # already closed: let the ping say so
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
