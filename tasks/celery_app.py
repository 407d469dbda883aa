"""The Celery app factory; publishers and workers both build their app here."""

from __future__ import annotations

from celery import Celery

from models import redaction
from models.settings import Settings, from_environment
from tasks import amqp_fixes, kombu_clients, kombu_fixes, log_context
from tasks.config import celery_config


def create_celery(settings: Settings, *, set_as_current: bool = True) -> Celery:
    """Build a configured Celery app. Builds no connection: that happens on first use."""
    redaction.install()  # workers and publishers alike: no secret in any log line
    log_context.connect_task_context()  # a task's lines name its job, stage and task id
    # A Redis restart must cost a reconnect, not the worker (kombu bug, see tasks.kombu_fixes).
    if settings.broker_closed_transport_guard:
        kombu_fixes.install()
    kombu_clients.install()  # one redis-py client per channel, not one per command
    # A stalled RabbitMQ read must end after the socket timeout, mid-frame too (tasks.amqp_fixes).
    if settings.broker_socket_timeout_s:
        amqp_fixes.install()
    app = Celery("genqueue", set_as_current=set_as_current)
    app.conf.update(celery_config(settings))
    # Tasks find their database, artifact directory and models through this.
    app.conf.genqueue_settings = settings
    return app


def app_settings(app: Celery) -> Settings:
    """The Settings `app` was built with (create_celery); tasks and worker signals read them here.

    An app not built by create_celery (Celery's default app, current in a process that has not
    imported ours) has none: it gets the process's environment, read through Settings.
    """
    settings: Settings | None = getattr(getattr(app, "conf", None), "genqueue_settings", None)
    return settings if settings is not None else from_environment()
