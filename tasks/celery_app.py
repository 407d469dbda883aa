"""The Celery app factory; publishers and workers both build their app here."""

from __future__ import annotations

from celery import Celery

from models import redaction
from models.settings import Settings
from tasks import kombu_fixes
from tasks.config import celery_config


def create_celery(settings: Settings | None = None, *, set_as_current: bool = True) -> Celery:
    """Build a configured Celery app. Builds no connection: that happens on first use."""
    settings = settings or Settings()
    redaction.install()  # workers and publishers alike: no secret in any log line
    # A Redis restart must cost a reconnect, not the worker (kombu bug, see tasks.kombu_fixes).
    if settings.broker_closed_transport_guard:
        kombu_fixes.install()
    app = Celery("genqueue", set_as_current=set_as_current)
    app.conf.update(celery_config(settings))
    # Tasks find their database, artifact directory and models through this.
    app.conf.genqueue_settings = settings
    return app
