"""Publishing a committed job to the broker as a text -> video chain."""

from __future__ import annotations

import uuid

from celery import Celery, chain
from celery.canvas import Signature

from tasks import names
from tasks.config import broker_priority


def job_signature(app: Celery, job_id: uuid.UUID | str, modality: str, priority: str) -> Signature:
    """The canvas for one job: fixed task ids per stage, compensation on any failure."""
    jid = str(job_id)
    prio = broker_priority(priority, app.conf.broker_url)
    text = app.signature(names.GENERATE_TEXT, args=(jid,), immutable=True).set(
        task_id=names.stage_task_id(jid, "text"), priority=prio
    )
    errback = app.signature(names.COMPENSATE, args=(jid,), immutable=True)
    if modality == "text":
        return text.on_error(errback)
    video = app.signature(names.GENERATE_VIDEO, args=(jid,), immutable=True).set(
        task_id=names.stage_task_id(jid, "video"), priority=prio
    )
    return chain(text, video).on_error(errback)


def stage_signature(
    app: Celery, job_id: uuid.UUID | str, stage: str, modality: str, priority: str
) -> Signature:
    """The rest of the job from `stage` on (the reaper's re-enqueue), same fixed task ids."""
    if stage != "video":
        return job_signature(app, job_id, modality, priority)
    jid = str(job_id)
    video = app.signature(names.GENERATE_VIDEO, args=(jid,), immutable=True).set(
        task_id=names.stage_task_id(jid, "video"), priority=broker_priority(priority, app.conf.broker_url)
    )
    return video.on_error(app.signature(names.COMPENSATE, args=(jid,), immutable=True))


def publish_compensation(app: Celery, job_id: uuid.UUID | str) -> None:
    """Ask a worker to compensate a canceled job; one quick try (the reaper catches a miss)."""
    app.send_task(
        names.COMPENSATE,
        args=(str(job_id),),
        task_id=names.stage_task_id(str(job_id), "compensate"),
        retry=False,
    )


def publish_job(
    app: Celery, job_id: uuid.UUID | str, modality: str, priority: str, stage: str = "text"
) -> None:
    """Send the job's first stage; raises kombu/OS errors if the broker cannot take it in time.

    Bounded: broker_connection_timeout per try, two quick retries, so a broker outage
    becomes a 503 within seconds instead of a hung request.
    """
    stage_signature(app, job_id, stage, modality, priority).apply_async(
        retry=True,
        retry_policy={
            "max_retries": 2,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.5,
        },
    )
