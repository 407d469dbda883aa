"""The model each stage of a job runs: the id asked for (models.catalog), its spec, the record of what ran."""

from __future__ import annotations

from typing import Any

from models import Job, catalog
from models.cache import spec_version
from models.settings import Settings


def asked(job: Job, stage: str) -> str | None:
    """The model id the job named for `stage`; None: it named none (or is from before jobs.models)."""
    named = ((job.models or {}).get(stage) or {}).get("asked")
    return str(named) if named else None


def to_run(job: Job, stage: str, settings: Settings) -> str:
    """The model id `stage` runs: the named one, else this worker's configured default."""
    return asked(job, stage) or catalog.default(settings, stage).id


def spec(settings: Settings, stage: str, model_id: str) -> str:
    """What the worker registry loads for `model_id` (tasks.generators.registry)."""
    return catalog.spec_of(settings, stage, model_id)


def ran(job: Job, stage: str, model_id: str, spec: str) -> dict[str, Any]:
    """jobs.models with `stage` recording that `model_id` ran as `spec` (its version), beside what was asked.

    Read-modify-write of the job as its stage entry read it: only one stage of a job runs at a
    time, and each writes its own key.
    """
    models = dict(job.models or {})
    models[stage] = {"asked": asked(job, stage), "id": model_id, "version": spec_version(spec)}
    return models
