"""Degraded retries of the video stage: fewer steps, a smaller size or a fallback model, once."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from models import Job, Stage
from models.settings import Settings
from tasks import job_models
from tasks.generators.base import VideoRequest
from tasks.generators.registry import side_multiple


def _side(value: int, factor: float, multiple: int) -> int:
    """`value` scaled down to a side the model accepts: a multiple of its grid, at least one cell."""
    return max(multiple, int(value * factor) // multiple * multiple)


def plan(job: Job, request: VideoRequest, settings: Settings, reason: str) -> dict[str, Any] | None:
    """The record of a degraded retry, or None when the job does not allow one (or had it)."""
    if not (job.params or {}).get("allow_degraded") or job.degraded:
        return None
    before = {"width": request.width, "height": request.height, "steps": request.steps}
    current = job_models.to_run(job, Stage.VIDEO, settings)
    model = settings.degraded_video_model or current
    # The retry's size must suit the model that will run it.
    multiple = side_multiple(job_models.spec(settings, Stage.VIDEO, model))
    after = {
        "width": _side(request.width, settings.degrade_size_factor, multiple),
        "height": _side(request.height, settings.degrade_size_factor, multiple),
        "steps": max(1, math.ceil(request.steps * settings.degrade_steps_factor)),
    }
    if after == before and model == current:
        return None  # nothing cheaper to try
    return {
        "reason": reason,
        "from": {**before, "model": current},
        "to": {**after, "model": model},
    }


def apply(job: Job, request: VideoRequest, settings: Settings) -> tuple[VideoRequest, str]:
    """The request and model id to run: the degraded ones when the job recorded a degradation."""
    record = job.degraded
    current = job_models.to_run(job, Stage.VIDEO, settings)
    if not record:
        return request, current
    to = record["to"]
    cheaper = dataclasses.replace(request, width=to["width"], height=to["height"], steps=to["steps"])
    return cheaper, to.get("model") or current
