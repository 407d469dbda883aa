"""Degraded retries of a render stage (video, image): fewer steps, a smaller size or another model, once."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar

from models import Job, Stage
from models.settings import Settings
from tasks import job_models
from tasks.generators.base import ImageRequest, VideoRequest
from tasks.generators.registry import side_multiple

RenderRequest = TypeVar("RenderRequest", VideoRequest, ImageRequest)


def stage_of(request: VideoRequest | ImageRequest) -> Stage:
    """The render stage a request belongs to."""
    return Stage.IMAGE if isinstance(request, ImageRequest) else Stage.VIDEO


def _models(job: Job, settings: Settings, stage: Stage) -> tuple[str, str]:
    """(the model id the stage runs for this job, the one its degraded retry runs on)."""
    model = job_models.to_run(job, stage, settings)
    fallback = settings.degraded_image_model if stage == Stage.IMAGE else settings.degraded_video_model
    return model, fallback or model


def _side(value: int, factor: float, multiple: int) -> int:
    """`value` scaled down to a side the model accepts: a multiple of its grid, at least one cell."""
    return max(multiple, int(value * factor) // multiple * multiple)


def plan(
    job: Job, request: VideoRequest | ImageRequest, settings: Settings, reason: str
) -> dict[str, Any] | None:
    """The record of a degraded retry, or None when the job does not allow one (or had it)."""
    if not (job.params or {}).get("allow_degraded") or job.degraded:
        return None
    stage = stage_of(request)
    current, model = _models(job, settings, stage)
    before = {"width": request.width, "height": request.height, "steps": request.steps}
    # The retry's size must suit the model that will run it.
    multiple = side_multiple(job_models.spec(settings, stage, model), stage)
    after = {
        "width": _side(request.width, settings.degrade_size_factor, multiple),
        "height": _side(request.height, settings.degrade_size_factor, multiple),
        "steps": max(1, math.ceil(request.steps * settings.degrade_steps_factor)),
    }
    if after == before and model == current:
        return None  # nothing cheaper to try
    return {"reason": reason, "from": {**before, "model": current}, "to": {**after, "model": model}}


def apply(job: Job, request: RenderRequest, settings: Settings) -> tuple[RenderRequest, str]:
    """The request and model id to run: the degraded ones when the job recorded a degradation."""
    current, _ = _models(job, settings, stage_of(request))
    record = job.degraded
    if not record:
        return request, current
    to = record["to"]
    cheaper = dataclasses.replace(request, width=to["width"], height=to["height"], steps=to["steps"])
    return cheaper, to.get("model") or current
