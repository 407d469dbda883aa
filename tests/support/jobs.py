"""Creating, publishing and watching jobs in tests, straight through the database and the broker."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import select

from models import Job, JobEvent, states
from models.db import transaction
from tests.support.procs import wait_for

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
    """The job's row once `pred(row)` holds; fails with its last status/stage/progress."""
    last: list[Job] = []

    def check() -> Job | None:
        last[:] = [get(sessions, jid)]
        return last[0] if pred(last[0]) else None

    try:
        return wait_for(check, timeout, 0.05, f"job {jid} to get {what or pred}")
    except AssertionError as exc:
        job = last[0]
        raise AssertionError(f"{exc}; it is {job.status}/{job.stage}/{job.progress}") from None


def wait_done(sessions: Any, jid: uuid.UUID, timeout: float = 60) -> Job:
    """The job's row once it has finished (succeeded, failed or canceled)."""
    return wait_until(sessions, jid, lambda j: j.status in FINISHED, timeout, "finished")


def wait_all_done(sessions: Any, ids: list[uuid.UUID], timeout: float = 60) -> dict[uuid.UUID, Job]:
    """The rows of `ids` once every one has finished, under one deadline for them all."""
    last: dict[uuid.UUID, Job] = {}

    def check() -> bool:
        last.update({jid: get(sessions, jid) for jid in ids})
        return all(job.status in FINISHED for job in last.values())

    try:
        wait_for(check, timeout, 0.05, f"{len(ids)} jobs to finish")
    except AssertionError as exc:
        states_ = {jid: (job.status, job.stage) for jid, job in last.items()}
        raise AssertionError(f"{exc}; {states_}") from None
    return dict(last)


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


def broker_messages(broker: Any, queue: str) -> list[dict[str, Any]]:
    """Messages waiting in a Redis queue, across kombu's priority sub-lists (`text`, `text\\x06\\x163`...)."""
    out = []
    for key in broker.scan_iter(match=f"{queue}*"):
        if key.decode().split("\x06\x16")[0] == queue and broker.type(key) == b"list":
            out += [json.loads(m) for m in broker.lrange(key, 0, -1)]
    return out


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
