"""Degraded retries of the video stage: fewer steps, a smaller size or a fallback model, once."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from models import Job
from models.settings import Settings
from tasks.generators.base import VideoRequest

SIDE_MULTIPLE = 16  # every bundled video adapter wants sides in multiples of 16
MIN_SIDE = 16


def _side(value: int, factor: float) -> int:
    return max(MIN_SIDE, int(value * factor) // SIDE_MULTIPLE * SIDE_MULTIPLE)


def plan(job: Job, request: VideoRequest, settings: Settings, reason: str) -> dict[str, Any] | None:
    """The record of a degraded retry, or None when the job does not allow one (or had it)."""
    if not (job.params or {}).get("allow_degraded") or job.degraded:
        return None
    before = {"width": request.width, "height": request.height, "steps": request.steps}
    after = {
        "width": _side(request.width, settings.degrade_size_factor),
        "height": _side(request.height, settings.degrade_size_factor),
        "steps": max(1, math.ceil(request.steps * settings.degrade_steps_factor)),
    }
    model = settings.degraded_video_model or settings.video_model
    if after == before and model == settings.video_model:
        return None  # nothing cheaper to try
    return {
        "reason": reason,
        "from": {**before, "model": settings.video_model},
        "to": {**after, "model": model},
    }


def apply(job: Job, request: VideoRequest, settings: Settings) -> tuple[VideoRequest, str]:
    """The request and model spec to run: the degraded ones when the job recorded a degradation."""
    record = job.degraded
    if not record:
        return request, settings.video_model
    to = record["to"]
    cheaper = dataclasses.replace(request, width=to["width"], height=to["height"], steps=to["steps"])
    return cheaper, to.get("model") or settings.video_model
