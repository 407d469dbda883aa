"""A shot's turn at the shot cache (models.shot_cache) before it renders: copy, wait, or render."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from models import Job, Stage
from models.base import utcnow
from models.db import transaction
from models.settings import Settings
from models.shot_cache import Source, lookup, requeue, shot_key
from models.storage import Storage, StorageError
from tasks import failures
from tasks.contract import names
from tasks.contract.routing import broker_priority
from tasks.generators.base import VideoRequest
from tasks.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Turn:
    """What the lookup decided: `copied` (the shot's own copy of an identical render: key, bytes,
    and where from), `waiting` (sent again for later), or neither (render it)."""

    copied: tuple[str, int, Source] | None = None
    waiting: bool = False


def key_of(job: Job, request: VideoRequest, models: Settings, model_id: str) -> str | None:
    """The shot's cache key, or None when its job does not take part (unseeded, or cache false:
    submit then gave the storyboard no key) or the cache is off."""
    if job.cache_key is None or request.seed is None or not models.cache_enabled:
        return None
    render = {k: v for k, v in dataclasses.asdict(request).items() if k != "prompt"}
    return shot_key(models, request.prompt, render, model_id)


def take_turn(task: Any, rt: Runtime, job: Job, index: int, key: str) -> Turn:
    """Look `key` up for the running shot (job, index) and act on what is found."""
    s_ = rt.settings
    # A render cannot outlive its hard limit: a claim older than that is a dead worker's.
    alive_since = utcnow() - timedelta(seconds=failures.hard_limit(s_, Stage.VIDEO) + s_.stage_grace_s)
    with transaction(rt.sessions) as s:
        found = lookup(s, key, job.tenant_id, job.id, index, alive_since)
        if found.busy:
            requeue(s, job.id, index)
    if found.busy:
        _again(task, job, index, s_.shot_cache_wait_s)
        log.info("job %s shot %d: an identical shot is rendering; looking again later", job.id, index)
        return Turn(waiting=True)
    if found.source is None:
        return Turn()
    try:
        shot_file, size = _copy(rt.storage, found.source.artifact_path, job.id, index)
    except (FileNotFoundError, KeyError, StorageError) as exc:  # removed meanwhile: render it
        log.info("job %s shot %d: cached shot gone (%s); rendering", job.id, index, type(exc).__name__)
        return Turn()
    src = found.source
    log.info("job %s shot %d: copied from job %s shot %d", job.id, index, src.job_id, src.index)
    return Turn(copied=(shot_file, size, src))


def _again(task: Any, job: Job, index: int, countdown: float) -> None:
    """The same shot task, later, at the storyboard's priority (a lost send is the reaper's:
    the shot is queued again, and the job's deadline brings its fan-out back)."""
    job_id = str(job.id)
    task.app.signature(
        names.RENDER_SHOT, args=(job_id, index), immutable=True,
        task_id=names.shot_task_id(job_id, index),
        priority=broker_priority(job.priority, task.app.conf.broker_url),
    ).apply_async(countdown=countdown)  # fmt: skip


def _copy(storage: Storage, source_key: str, job_id: uuid.UUID, index: int) -> tuple[str, int]:
    """The source shot's MP4 copied under this shot's fixed key (a redelivery rewrites it)."""
    key = names.artifact_key(job_id, names.shot_name(index))
    with storage.open(source_key) as src, storage.writing(key, "video/mp4") as path, path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
        size = dst.tell()
    return key, size
