"""Which model each stage of a new job runs: the `model` field checked against the configured catalog."""

from __future__ import annotations

from collections.abc import Mapping

from app.errors import ValidationFailed
from models import catalog
from models.settings import Settings
from tasks.contract.stages import PIPELINES, model_stages


def _modalities_running(stage: str) -> list[str]:
    return [str(m) for m, stages in PIPELINES.items() if stage in model_stages(m)]


def choose(
    settings: Settings, modality: str, asked: str | Mapping[catalog.StageName, str] | None
) -> dict[str, str | None]:
    """stage -> the model id named for it, for every stage the job runs (None: it named none, and
    the worker runs its configured default).

    A plain id names the model of the job's last stage (the one that makes its output). Raises
    ValidationFailed (422) naming `model` or `model.<stage>` for an unknown model or stage.
    """
    stages = [str(s) for s in model_stages(modality)]
    named: dict[str, tuple[str, str]] = {}  # stage -> (the request field, the id)
    errors: list[dict[str, str]] = []
    if isinstance(asked, str):
        named[stages[-1]] = ("model", asked)
    elif asked:
        for key, model_id in asked.items():
            if key in stages:
                named[key] = (f"model.{key}", model_id)
                continue
            runs = _modalities_running(key)
            message = f"only valid for {' or '.join(runs)} jobs" if runs else "unknown stage"
            errors.append({"field": f"model.{key}", "message": message})
    chosen: dict[str, str | None] = {}
    for stage in stages:
        if stage not in named:
            chosen[stage] = None
            continue
        field, model_id = named[stage]
        if catalog.find(settings, stage, model_id) is None:
            known = ", ".join(m.id for m in catalog.configured(settings) if m.stage == stage)
            message = f"unknown {stage} model {model_id[:80]!r}; known: {known}"
            errors.append({"field": field, "message": message})
        chosen[stage] = model_id
    if errors:
        raise ValidationFailed("The job is invalid.", errors=errors)
    return chosen


def resolved(defaults: Mapping[str, str], chosen: Mapping[str, str | None]) -> dict[str, str]:
    """stage -> the model id it runs, the default's id (`defaults`: stage -> id) where none was named."""
    return {stage: model_id or defaults[stage] for stage, model_id in chosen.items()}
