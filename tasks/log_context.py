"""Celery's side of the logs: each task's lines carry its task_id, job_id and stage; worker and
beat processes log through models.logs instead of Celery's own setup."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import setup_logging, task_postrun, task_prerun

from models import logs
from models.settings import Settings
from tasks.contract import names
from tasks.contract.stages import stage_of_task

# The tasks whose first argument is a job id (the pipeline's); the others take other ids.
JOB_TASKS = frozenset({names.GENERATE_TEXT, names.GENERATE_VIDEO, names.COMPENSATE})


def _task_started(task_id: str | None = None, task: Any = None, args: Any = (), **_: Any) -> None:
    name = getattr(task, "name", None)
    job_id = args[0] if name in JOB_TASKS and args else None
    logs.clear(task_id=task_id, job_id=job_id, stage=stage_of_task(name))


def _task_finished(**_: Any) -> None:
    logs.clear()  # a pool thread or child between tasks belongs to no job


def connect_task_context() -> None:
    """Bind and clear the task fields around every task this process runs (idempotent)."""
    task_prerun.connect(_task_started, weak=False, dispatch_uid="genqueue-log-task-started")
    task_postrun.connect(_task_finished, weak=False, dispatch_uid="genqueue-log-task-finished")


def connect_process_logging(app: Celery, settings: Settings) -> None:
    """Let models.logs configure a `celery -A tasks.worker worker|beat` process (idempotent).

    A receiver of setup_logging replaces Celery's own configuration. Its level is GENQUEUE_LOG_LEVEL
    when set, else the command's `-l`. Standard output and error are still redirected to the
    `celery.redirected` logger (as Celery does), so a stray print becomes a log line too.
    """

    def configure(loglevel: int | str | None = None, **_: Any) -> None:
        explicit = "log_level" in settings.model_fields_set
        logs.configure(settings.log_format, settings.log_level if explicit else (loglevel or logging.WARNING))
        if app.conf.worker_redirect_stdouts:
            app.log.redirect_stdouts(app.conf.worker_redirect_stdouts_level)

    setup_logging.connect(configure, weak=False, dispatch_uid="genqueue-log-setup")
