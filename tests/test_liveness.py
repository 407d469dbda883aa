"""Checkout pings (models.liveness): only when a connection may have died, and then always."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, text

from models.db import make_engine

Pinged = tuple[Engine, list[object]]


@pytest.fixture
def pinged(settings) -> Iterator[Callable[[float], Pinged]]:
    """Worker-style engines (one pooled connection) that log each ping's DBAPI connection."""
    engines: list[Engine] = []

    def make(idle_s: float) -> Pinged:
        engine = make_engine(settings.database_url, pool_size=1, max_overflow=0, ping_idle_s=idle_s)
        engines.append(engine)
        pings: list[object] = []
        real = engine.dialect.do_ping

        def do_ping(dbapi_conn: object) -> bool:
            pings.append(dbapi_conn)
            return real(dbapi_conn)

        engine.dialect.do_ping = do_ping  # type: ignore[method-assign]
        return engine, pings

    yield make
    for engine in engines:
        engine.dispose()


def _backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_connection_back_in_use_at_once_is_not_pinged(pinged):
    engine, pings = pinged(30)
    first = _backend_pid(engine)  # connects: a fresh connection needs no ping either
    assert all(_backend_pid(engine) == first for _ in range(5))
    assert pings == []


def test_an_idle_connection_is_pinged(pinged):
    engine, pings = pinged(0.2)
    first = _backend_pid(engine)
    time.sleep(0.3)
    assert _backend_pid(engine) == first
    assert len(pings) == 1


def test_a_connection_killed_while_checked_in_is_replaced_before_use(pinged, engine):
    """Within the idle window too: the server's goodbye on the socket triggers the ping."""
    worker, pings = pinged(30)  # so the clock cannot be what triggers the ping
    victim = _backend_pid(worker)
    with engine.connect() as admin:
        assert admin.execute(text("SELECT pg_terminate_backend(:p)"), {"p": victim}).scalar_one()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the backend exits shortly after it was told to
        with engine.connect() as admin:
            gone = admin.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": victim}).first()
        if gone is None:
            break
    assert _backend_pid(worker) != victim  # no error: the dead connection never reached us
    assert len(pings) == 1
