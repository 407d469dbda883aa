"""Per-process worker resources (settings, database engine), created lazily after the fork."""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from celery import Celery
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from models.db import make_engine, make_session_factory
from models.settings import Settings
from models.storage import Storage, open_storage
from tasks import model_presence
from tasks.celery_app import app_settings
from tasks.contract.publish import wake_dispatch_on_commit


@dataclass
class Runtime:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    pid: int
    app: Celery | None = None  # the worker's app: what a task publishes after a commit goes through it

    @property
    def artifact_dir(self) -> Path:
        return Path(self.settings.artifact_dir)

    @functools.cached_property
    def storage(self) -> Storage:
        """Where this process writes and removes artifacts (built on first use, after the fork)."""
        return open_storage(self.settings)


_runtimes: dict[int, Runtime] = {}
_lock = threading.Lock()


def runtime(app: Celery) -> Runtime:
    """The runtime of `app` in this process; a forked child builds its own engine."""
    key = id(app)
    with _lock:
        rt = _runtimes.get(key)
        if rt is None or rt.pid != os.getpid():
            settings = app_settings(app)
            engine = make_engine(
                settings.database_url,
                pool_size=settings.worker_db_pool_size,
                max_overflow=settings.worker_db_max_overflow,
                connect_timeout=settings.db_connect_timeout_s,
            )
            rt = Runtime(settings, engine, make_session_factory(engine), os.getpid(), app)
            wake_dispatch_on_commit(rt.sessions, app)  # transitions wake the webhook dispatcher
            model_presence.start(settings)  # GET /v1/models learns what this process loads
            _runtimes[key] = rt
        return rt


def dispose_all() -> None:
    """Close every runtime's pooled connections and forget them (tests, after each worker).

    Safe while a worker still runs: a disposed engine opens new connections on demand, and the
    next task builds a fresh runtime.
    """
    with _lock:
        gone = list(_runtimes.values())
        _runtimes.clear()
    for rt in gone:
        rt.engine.dispose()
