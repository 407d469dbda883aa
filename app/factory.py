"""The app factory: create_app builds the Flask API from Settings."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery import Celery
from flask import Flask

from app import (
    admission,
    api_docs,
    auth,
    batch,
    errors,
    events,
    headers,
    health,
    job_control,
    jobs,
    limits,
    media,
    metrics,
    models_api,
    openapi,
    request_id,
    usage,
    webhooks,
)
from app.job_access import JobIdConverter
from app.services import EXTENSION, Services
from models import redaction
from models.db import make_engine, make_session_factory
from models.media_links import MediaSigner
from models.settings import Settings
from models.storage import open_storage
from tasks.celery_app import create_celery  # publishing only: never tasks.pipeline or torch
from tasks.contract.publish import wake_dispatch_on_commit

_SETTINGS_ALIASES = {"DATABASE_URL", "BROKER_URL"}


def _settings(config: Settings | Mapping[str, Any] | None) -> tuple[Settings, dict[str, Any]]:
    """Settings from the argument or the environment; UPPER_CASE mapping keys are Flask config."""
    if isinstance(config, Settings):
        return config, {}
    values = dict(config or {})
    flask_conf = {k: values.pop(k) for k in list(values) if k.isupper() and k not in _SETTINGS_ALIASES}
    return Settings(**values), flask_conf


def create_app(
    config: Settings | Mapping[str, Any] | None = None, *, celery_app: Celery | None = None
) -> Flask:
    """Build the API. Connections to Postgres and the broker open lazily, on first use."""
    settings, flask_conf = _settings(config)
    redaction.install()
    app = Flask(__name__)
    app.config.update(flask_conf)
    # werkzeug caps every body read, chunked uploads included, but silently truncates a
    # chunked body at the cap: one byte of headroom lets the handler see it was over.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes + 1

    engine = make_engine(
        settings.database_url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        connect_timeout=settings.db_connect_timeout_s,
        pre_ping=settings.db_web_pre_ping,
    )
    app.extensions[EXTENSION] = Services(
        settings=settings,
        engine=engine,
        sessions=make_session_factory(engine),
        # Not "current": in embedded mode the worker's app shares this process.
        celery=celery_app or create_celery(settings, set_as_current=False),
        # Absolute, so send_file does not resolve it against the package directory.
        artifact_dir=Path(settings.artifact_dir).absolute(),
        storage=open_storage(settings),
        metrics=metrics.Metrics(),
        media_signer=MediaSigner.from_settings(settings),
    )

    request_id.init_app(app)  # first: every other hook's lines and answers carry the id
    headers.init_app(app, settings)
    errors.register_error_handler(app)
    metrics.init_app(app)
    # Auth before the limiter: it keys its counters by the authenticated key.
    auth.init_app(app, settings.auth_cache_s)
    limits.init_app(app, settings)
    admission.init_app(app, settings, app.extensions[EXTENSION].sessions)
    app.url_map.converters["job_id"] = JobIdConverter  # before the rules that use it
    app.register_blueprint(jobs.bp)
    app.register_blueprint(batch.bp)
    app.register_blueprint(job_control.bp)
    app.register_blueprint(events.bp)
    app.register_blueprint(health.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(api_docs.bp)
    app.register_blueprint(webhooks.bp)
    app.register_blueprint(usage.bp)
    app.register_blueprint(models_api.bp)
    app.register_blueprint(media.bp)
    wake_dispatch_on_commit(app.extensions[EXTENSION].sessions, app.extensions[EXTENSION].celery)
    return app
