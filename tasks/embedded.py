"""Single-process mode: SQLite, the in-process memory broker and a worker thread, no external services."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery import Celery
from pydantic import SecretStr

from models.db import make_engine, make_session_factory, transaction
from models.keys import authenticate, create_key
from models.migrate import upgrade
from models.settings import Settings
from models.tenant import DEFAULT_TENANT_NAME
from tasks.celery_app import create_celery
from tasks.contract import names
from tasks.lifecycle import preload_kinds, preload_models

__all__ = ["embedded_dev_key", "embedded_settings", "embedded_worker", "preload_kinds"]

log = logging.getLogger("genqueue.embedded")


def embedded_settings(data_dir: Path, **overrides: object) -> Settings:
    """Settings for one process holding the database file, the broker and the worker."""
    data_dir = Path(data_dir).resolve()
    values: dict[str, Any] = {  # validated by Settings
        "database_url": f"sqlite:///{data_dir / 'genqueue.db'}",
        "broker_url": "memory://localhost/",
        "artifact_dir": data_dir / "artifacts",
        "worker_preload": "text,video",
        "ratelimit_url": "memory://",  # one process: the limits library's memory storage, no Redis
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    settings = Settings(**values)
    if settings.media_url_keys is None:  # signed links work out of the box on a development box
        settings.media_url_keys = SecretStr(_dev_media_key(data_dir))
    return settings


def _dev_media_key(data_dir: Path) -> str:
    """A random signing key kept beside the database: links survive a restart of the process."""
    path = data_dir / DEV_MEDIA_KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


@contextmanager
def embedded_worker(
    settings: Settings, concurrency: int = 2, on_loaded: Callable[[str], None] | None = None
) -> Iterator[Celery]:
    """Migrate the SQLite database, load the models, and run a worker thread on every queue.

    `on_loaded(description)` after each model has loaded (tasks.lifecycle.preload_models).
    """
    from celery.contrib.testing.worker import start_worker

    import tasks.pipeline
    import tasks.storyboard  # noqa: F401  (a storyboard's too)

    upgrade(settings.database_url)
    Path(settings.artifact_dir).mkdir(parents=True, exist_ok=True)
    app = create_celery(settings)
    loaded = preload_models(settings, on_loaded)
    log.info("embedded worker ready; models: %s", ", ".join(loaded) or "lazy")
    # The threads pool: the memory transport only works between threads of one process.
    with start_worker(
        app,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        shutdown_timeout=60,
        loglevel="WARNING",
        queues=list(names.ALL_QUEUES),
    ):
        yield app


DEV_KEY_FILE = "dev-api-key"
DEV_MEDIA_KEY_FILE = "dev-media-url-key"


def embedded_dev_key(settings: Settings) -> str:
    """The local development key (default tenant), kept beside the database so it stays the same.

    Created on first use, or again if it was revoked; the file is readable by its owner only.
    """
    path = Path(settings.artifact_dir).parent / DEV_KEY_FILE
    engine = make_engine(settings.database_url)
    try:
        with transaction(make_session_factory(engine)) as s:
            key = path.read_text().strip() if path.exists() else ""
            if key and authenticate(s, key) is not None:
                return key
            key = create_key(s, DEFAULT_TENANT_NAME, "embedded development key")[1]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(key + "\n")
        return key
    finally:
        engine.dispose()
