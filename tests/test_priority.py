"""Priorities with both brokers: behind a backlog of 1000 low jobs, a high one is the next to start."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import func, insert, select

from models import Job
from models.base import utcnow
from tasks.celery_app import create_celery
from tasks.contract import names
from tasks.contract.publish import publish_job
from tasks.contract.routing import broker_priority
from tests.support.procs import wait_for
from tests.support.workers import in_process_worker

BACKLOG = 1000
pytestmark = pytest.mark.slow  # 1000-message backlogs on two brokers: ~1 min


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(params=["redis", "amqp"])
def broker_app(request, settings, broker) -> Iterator[Celery]:
    """A Celery app on the per-run Redis db, or on a RabbitMQ vhost of its own (removed after)."""
    if request.param == "redis":
        yield create_celery(settings, set_as_current=False)
        return
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not installed")
    vhost = f"gq_test_{uuid.uuid4().hex[:10]}"
    try:
        _rabbitmqctl("add_vhost", vhost)
        _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot create a RabbitMQ vhost: {exc}")
    url = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    try:
        yield create_celery(settings.model_copy(update={"broker_url": url}), set_as_current=False)
    finally:
        _rabbitmqctl("delete_vhost", vhost)


def _add_jobs(sessions, n: int, priority: str, **fields: Any) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(n)]
    now = utcnow()
    rows = [
        {"id": i, "status": "queued", "modality": "text", "prompt": f"p{k}", "params": {},
         "priority": priority, "progress": 0, "metadata": {}, "attempts": 0, "created_at": now,
         "updated_at": now} | fields
        for k, i in enumerate(ids)
    ]  # fmt: skip
    with sessions.begin() as s:
        s.execute(insert(Job), rows)
    return ids


def _publish_video_stage(app: Celery, job_id: uuid.UUID, priority: str) -> None:
    app.signature(names.GENERATE_VIDEO, args=(str(job_id),), immutable=True).set(
        task_id=names.stage_task_id(str(job_id), "video"),
        priority=broker_priority(priority, app.conf.broker_url),
    ).apply_async()


def _run_until(app: Celery, queue: str, done: Any, timeout: float = 60) -> None:
    """A worker with one execution slot on `queue`, stopped as soon as `done()` holds."""
    with in_process_worker(app, concurrency=1, queues=[queue]):
        wait_for(done, timeout, 0.05, "the worker to start enough jobs")


def test_high_priority_starts_first_on_the_text_stage(broker_app, sessions) -> None:
    low = _add_jobs(sessions, BACKLOG, "low")
    for jid in low:  # all waiting before any worker runs
        publish_job(broker_app, jid, "text", "low")
    [high] = _add_jobs(sessions, 1, "high")
    publish_job(broker_app, high, "text", "high")

    def started() -> int:
        with sessions() as s:
            return s.scalar(select(func.count()).where(Job.started_at.is_not(None))) or 0

    _run_until(broker_app, names.TEXT_QUEUE, lambda: started() >= 3)
    with sessions() as s:
        order = list(s.scalars(select(Job.id).where(Job.started_at.is_not(None)).order_by(Job.started_at)))
    assert order[0] == high, f"high started {order.index(high) + 1}th" if high in order else "high never ran"


def test_high_priority_starts_first_on_the_video_stage(broker_app, sessions) -> None:
    # Jobs whose text stage is done: each waits for its video stage in the video queue.
    video = {"status": "running", "stage": "video", "modality": "video", "output_text": "Shot: a fox",
             "params": {"width": 64, "height": 64, "num_frames": 1, "fps": 1, "steps": 1}}  # fmt: skip
    low = _add_jobs(sessions, BACKLOG, "low", **video)
    for jid in low:
        _publish_video_stage(broker_app, jid, "low")
    [high] = _add_jobs(sessions, 1, "high", **video)
    _publish_video_stage(broker_app, high, "high")

    def finished() -> int:
        with sessions() as s:
            return s.scalar(select(func.count()).where(Job.completed_at.is_not(None))) or 0

    _run_until(broker_app, names.VIDEO_QUEUE, lambda: finished() >= 3)
    with sessions() as s:
        # One execution slot: the order they finished is the order they started.
        order = list(
            s.scalars(select(Job.id).where(Job.completed_at.is_not(None)).order_by(Job.completed_at))
        )
    assert order[0] == high, f"high finished {order.index(high) + 1}th" if high in order else "high never ran"


def test_queue_positions_as_a_worker_takes_jobs_and_after_a_cancel(broker_app, sessions) -> None:
    """app.queue's places against the true order, while a real worker on each broker takes jobs."""
    from app.queue import QueueCounts
    from models import states
    from models.db import transaction

    low = _add_jobs(sessions, 30, "low")
    high = _add_jobs(sessions, 5, "high")
    for jid, prio in [(j, "low") for j in low] + [(j, "high") for j in high]:
        publish_job(broker_app, jid, "text", prio)
    counts = QueueCounts(ttl_s=0)

    def places() -> tuple[list[uuid.UUID], dict[uuid.UUID, int]]:
        """The queued jobs in the order workers take them (high first, then by number), and places."""
        with sessions() as s:
            rows = list(s.scalars(select(Job).where(Job.status == "queued")))
            order = sorted(rows, key=lambda j: (j.priority != "high", j.queue_seq))
            return [j.id for j in order], counts.positions(s, rows)

    order, got = places()
    assert order == high + low and [got[j] for j in order] == list(range(1, 36))

    def started() -> int:
        with sessions() as s:
            return s.scalar(select(func.count()).where(Job.started_at.is_not(None))) or 0

    _run_until(broker_app, names.TEXT_QUEUE, lambda: started() >= 8)
    order, got = places()
    assert len(order) <= 27 and [got[j] for j in order] == list(range(1, len(order) + 1))
    with transaction(sessions) as s:  # the head of what is left: exact again
        assert states.cancel(s, order[0])
    order, got = places()
    assert [got[j] for j in order] == list(range(1, len(order) + 1))
