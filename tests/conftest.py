"""Shared fixtures: a per-run Postgres database and Redis db, the Flask app, a real Celery worker."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from psycopg.errors import DeadlockDetected
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from models.base import Base
from models.db import make_engine, make_session_factory, transaction
from models.keys import ensure_default_tenant
from models.migrate import upgrade
from models.settings import Settings
from tests.support.api import authed_client_class, make_api_key
from tests.support.infra import PG_ADMIN, REDIS_HOST
from tests.support.workers import in_process_worker

# Every table, dependents first (TRUNCATE ... CASCADE would reach them anyway; the order keeps it quiet).
TABLES = tuple(t.name for t in reversed(Base.metadata.sorted_tables))


def _claim_redis_db() -> int:
    """Take a Redis db number no other concurrent test run holds (lease in db 0)."""
    r = redis.Redis.from_url(f"{REDIS_HOST}/0")
    for n in range(1, 16):
        if r.set(f"genqueue:test-db-lease:{n}", os.getpid(), nx=True, ex=3 * 3600):
            return n
    raise RuntimeError("all Redis test databases 1-15 are leased; remove stale genqueue:test-db-lease:* keys")


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh, migrated Postgres database for this test run, dropped afterwards."""
    name = f"gq_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def redis_db() -> Iterator[int]:
    n = _claim_redis_db()
    client = redis.Redis.from_url(f"{REDIS_HOST}/{n}")
    client.flushdb()
    yield n
    client.flushdb()
    redis.Redis.from_url(f"{REDIS_HOST}/0").delete(f"genqueue:test-db-lease:{n}")


@pytest.fixture(scope="session")
def redis_url(redis_db: int) -> str:
    return f"{REDIS_HOST}/{redis_db}"


@pytest.fixture(scope="session")
def artifact_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("artifacts")


@pytest.fixture(scope="session")
def settings(pg_url: str, redis_url: str, artifact_root: Path) -> Settings:
    return Settings(
        database_url=pg_url,
        broker_url=redis_url,
        artifact_dir=artifact_root,
        # Worker subprocesses record held messages here, not in the checkout's var/.
        worker_held_dir=artifact_root.parent / "worker-held",
        text_model="echo",
        video_model="echo",
        image_model="echo",
        retry_backoff_s=0.05,
        retry_backoff_max_s=0.2,
        progress_interval_s=0.05,
        # Tests revoke keys and change plans between requests; the key cache has its own tests.
        auth_cache_s=0,
        # Many apps and workers share one Postgres (max_connections 100) during a run.
        db_max_overflow=2,
    )


@pytest.fixture(scope="session")
def engine(settings: Settings):
    eng = make_engine(settings.database_url, pool_size=5)
    yield eng
    eng.dispose()


def _truncate(engine) -> None:
    """Empty every table; a module-scoped worker may still be writing (an event, an outbox row),
    and Postgres may pick the TRUNCATE as a deadlock's victim: then it is simply run again."""
    for attempt in range(5):
        try:
            with engine.begin() as conn:
                conn.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
            return
        except OperationalError as exc:
            if not isinstance(exc.orig, DeadlockDetected) or attempt == 4:
                raise
            time.sleep(0.1)


@pytest.fixture
def sessions(engine) -> sessionmaker[Session]:
    """Session factory on the per-run database, emptied before each test (the default tenant kept)."""
    _truncate(engine)
    factory = make_session_factory(engine)
    with transaction(factory) as s:
        ensure_default_tenant(s)  # jobs written without a tenant_id belong to it
    return factory


@pytest.fixture
def broker(redis_url: str) -> redis.Redis:
    """The per-run Redis db, emptied before each test so no message leaks between tests."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    return client


@pytest.fixture(scope="session")
def celery_app(settings: Settings):
    from tasks.celery_app import create_celery

    return create_celery(settings)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """A `genqueue` command run in-process (CliRunner) configures this process's logging (root at
    WARNING, its own handler): put every logger's level and handlers back after each test, so
    the next test's INFO lines still reach its log capture."""
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    saved = [(lg, lg.level, lg.handlers[:], lg.propagate, lg.disabled) for lg in loggers]
    yield
    for lg, level, handlers, propagate, disabled in saved:
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate, lg.disabled = propagate, disabled


@pytest.fixture(autouse=True)
def _release_worker_connections() -> Iterator[None]:
    """In-process workers keep a runtime (and its pooled connections) per Celery app: close them
    after each test, so a run stays well under Postgres's max_connections."""
    yield
    from tasks import runtime

    runtime.dispose_all()


@pytest.fixture
def api_key(sessions) -> str:
    """A key of the default tenant, which owns every job a test writes without a tenant_id."""
    return make_api_key(sessions)


@pytest.fixture
def app(settings: Settings, sessions, broker, api_key):
    from app import create_app

    flask_app = create_app(settings)
    flask_app.testing = True
    flask_app.test_client_class = authed_client_class(api_key)  # app.test_client() is authenticated
    yield flask_app
    # Its pooled connections go now, not whenever the app is collected: a run must stay well
    # under Postgres's max_connections (100) with workers and other apps alive.
    flask_app.extensions["genqueue"].engine.dispose()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def anon_client(app) -> FlaskClient:
    """A client that sends no Authorization header."""
    return FlaskClient(app, app.response_class, use_cookies=True)


@pytest.fixture
def tenant_client(app, sessions) -> Callable[..., FlaskClient]:
    """tenant_client("acme", max_width=512): a client of another tenant, with plan overrides."""

    def make(name: str = "other", **plan: Any) -> FlaskClient:
        return authed_client_class(make_api_key(sessions, name, **plan))(app, app.response_class, True)

    return make


@pytest.fixture
def worker(celery_app, sessions, broker):
    """A real Celery worker (threads pool) consuming every queue of the per-run broker."""
    with in_process_worker(celery_app) as w:
        yield w


@pytest.fixture
def make_app(settings: Settings, sessions, broker, api_key) -> Iterator[Callable[..., Flask]]:
    """make_app(**overrides): an app on altered settings (a dead database or broker, other limits),
    its test client authenticated as the default tenant; its pool is closed afterwards."""
    from app import create_app

    apps: list[Flask] = []

    def build(**overrides: Any) -> Flask:
        flask_app = create_app(settings.model_copy(update=overrides))
        flask_app.test_client_class = authed_client_class(api_key)
        apps.append(flask_app)
        return flask_app

    yield build
    for flask_app in apps:
        flask_app.extensions["genqueue"].engine.dispose()
