"""Creating, publishing and watching jobs in tests, straight through the database and the broker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import select

from models import Job, JobEvent, states
from models.db import transaction
from models.settings import Settings

SMALL_VIDEO = {"width": 64, "height": 48, "num_frames": 5, "fps": 6, "steps": 3}
FINISHED = ("succeeded", "failed", "canceled")


def create_job(sessions: Any, modality: str = "video", prompt: str = "a red fox", **params: Any) -> uuid.UUID:
    defaults = SMALL_VIDEO if modality == "video" else {}
    with transaction(sessions) as s:
        job = Job(modality=modality, prompt=prompt, params=defaults | params)
        s.add(job)
        s.flush()
        return job.id


def submit(sessions: Any, app: Celery, modality: str = "video", prompt: str = "a red fox", **params: Any):
    """Commit a job and publish its chain, as the API does."""
    from tasks.contract.publish import publish_job

    jid = create_job(sessions, modality, prompt, **params)
    publish_job(app, jid, modality, "normal")
    with transaction(sessions) as s:
        states.mark_published(s, jid)
    return jid


def get(sessions: Any, jid: uuid.UUID) -> Job:
    with sessions() as s:
        job = s.get(Job, jid)
        assert job is not None
        return job


def wait_until(sessions: Any, jid: uuid.UUID, pred: Any, timeout: float = 60, what: str = "") -> Job:
    deadline = time.monotonic() + timeout
    while True:
        job = get(sessions, jid)
        if pred(job):
            return job
        if time.monotonic() > deadline:
            state = f"{job.status}/{job.stage}/{job.progress}"
            raise AssertionError(f"job {jid} never got {what or pred}: {state}")
        time.sleep(0.05)


def wait_done(sessions: Any, jid: uuid.UUID, timeout: float = 60) -> Job:
    return wait_until(sessions, jid, lambda j: j.status in FINISHED, timeout, "finished")


def events(sessions: Any, jid: uuid.UUID) -> list[str]:
    """The job's events in order, without the throttled (timing-dependent) job.progress ones."""
    with sessions() as s:
        q = (
            select(JobEvent.type)
            .where(JobEvent.job_id == jid, JobEvent.type != "job.progress")
            .order_by(JobEvent.id)
        )
        return list(s.scalars(q))


def event_rows(sessions: Any, jid: uuid.UUID, type_: str) -> list[JobEvent]:
    with sessions() as s:
        q = select(JobEvent).where(JobEvent.job_id == jid, JobEvent.type == type_).order_by(JobEvent.id)
        return list(s.scalars(q))


def files(root: Path, jid: uuid.UUID) -> list[str]:
    folder = Path(root) / str(jid)
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def broker_idle(client: Any) -> bool:
    """No message waiting in any queue of this Redis db and none delivered but unacked."""
    from tasks.contract.names import ALL_QUEUES

    for key in client.scan_iter():
        name = key.decode()
        if name in ("unacked", "unacked_index") and client.exists(key):
            return False
        # kombu keeps a queue's priority levels in lists named "<queue>\x06\x16<priority>"
        if name.split("\x06\x16")[0] in ALL_QUEUES and client.llen(key):
            return False
    return True


@contextmanager
def thread_workers(settings: Settings, **overrides: Any) -> Iterator[Celery]:
    """A real Celery worker (threads pool, every queue) on settings with `overrides`."""
    from celery.contrib.testing.worker import start_worker

    import tasks.maintenance
    import tasks.pipeline  # noqa: F401  registers the tasks
    from tasks.celery_app import create_celery

    app = create_celery(settings.model_copy(update=overrides), set_as_current=False)
    with ExitStack() as stack:
        stack.enter_context(
            start_worker(
                app, pool="threads", concurrency=4, perform_ping_check=False,
                shutdown_timeout=30, loglevel="WARNING",
            )
        )  # fmt: skip
        yield app
