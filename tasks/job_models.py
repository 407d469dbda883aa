"""The model each stage of a job runs: the id asked for (models.catalog), its spec, the record of what ran."""

from __future__ import annotations

from typing import Any

from models import Job, catalog
from models.cache import spec_version
from models.settings import Settings


def asked(job: Job, stage: str, settings: Settings) -> str:
    """The model id the job asked `stage` to run (a job from before jobs.models: the default)."""
    chosen = (job.models or {}).get(stage) or {}
    return str(chosen.get("asked") or catalog.default(settings, stage).id)


def spec(settings: Settings, stage: str, model_id: str) -> str:
    """What the worker registry loads for `model_id` (tasks.generators.registry)."""
    return catalog.spec_of(settings, stage, model_id)


def ran(job: Job, stage: str, model_id: str, settings: Settings) -> dict[str, Any]:
    """jobs.models with `stage` recording that `model_id` ran (and its version), beside what was asked.

    Read-modify-write of the job as its stage entry read it: only one stage of a job runs at a
    time, and each writes its own key.
    """
    models = dict(job.models or {})
    version = spec_version(spec(settings, stage, model_id))
    models[stage] = {"asked": asked(job, stage, settings), "id": model_id, "version": version}
    return models
