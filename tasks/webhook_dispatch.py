"""Waking the webhook dispatcher: publish its task for jobs whose outbox messages just committed."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from celery import Celery
from sqlalchemy.orm import Session, sessionmaker

from models import outbox
from models.settings import Settings
from tasks import names


def publish_dispatch(app: Celery, job_ids: Iterable[uuid.UUID], countdown: float | None = None) -> None:
    """Send one dispatch per job to the webhooks queue, by task name (no import of the task)."""
    for job_id in job_ids:
        app.send_task(
            names.DELIVER_WEBHOOK,
            args=(str(job_id),),
            countdown=countdown,
            # Right after a commit, on a GPU worker's or a request's path: one quick try. If the
            # broker is down the message waits in the outbox and the relay sends it later.
            retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.2},
        )


def install(sessions: sessionmaker[Session], app: Celery) -> None:
    """Every commit through `sessions` that wrote outbox messages wakes their jobs' dispatchers."""
    outbox.on_commit(sessions, lambda job_ids: publish_dispatch(app, job_ids))


def beat_schedule(settings: Settings) -> dict[str, dict[str, object]]:
    """The relay's beat entry (tasks.webhooks.relay_webhooks)."""
    interval = settings.webhook_relay_interval_s
    return {
        "relay-webhooks": {
            "task": names.RELAY_WEBHOOKS,
            "schedule": interval,
            "options": {"expires": interval},  # a backlog of relay ticks is worth one tick
        }
    }
