"""GET /v1/models: the models a job may name, their params, versions, queues and whether they are warm."""

from __future__ import annotations

import functools
import logging
from collections import Counter
from typing import Any, Literal, get_args

import redis
from flask import Blueprint, Response, current_app, jsonify
from pydantic import BaseModel, Field, TypeAdapter

from app.auth import current_principal
from app.schemas import JobCreate
from app.services import extension, services
from models import catalog, presence
from models.cache import spec_version
from models.plans import Plan
from models.resource import Resource
from models.swaps import Swaps
from tasks.contract.stages import PIPELINES, QUEUES, as_stage, model_stages

log = logging.getLogger("genqueue.api")
bp = Blueprint("models", __name__, url_prefix="/v1")


class ModelInfo(Resource):
    """A model a job may name (model_resource)."""

    object: Literal["model"]
    id: str = Field(description="What a job's `model` names.")
    stage: str = Field(description="The pipeline stage it runs (`text`, `video`, `image`).")
    modalities: list[str] = Field(description="The job modalities that run this stage.")
    default: bool = Field(description="The stage's model when a job names none.")
    source: Literal["builtin", "directory", "adapter"] = Field(
        description="Bundled, a local model directory, or an adapter class (`module:Class`)."
    )
    version: str = Field(description="Package version or a local folder's stamp; part of the cache key.")
    queue: str = Field(description="The worker queue that serves the stage.")
    warm: bool | None = Field(description="A live worker process has it loaded; null: unknown (Redis down).")
    warm_workers: int | None = Field(description="How many live worker processes have it loaded.")
    allowed: bool = Field(description="The caller's plan lets its jobs run it (else 403 on submit).")
    params: dict[str, Any] = Field(description="JSON Schema of `params` for a job running it: names, bounds.")


class ModelList(Resource):
    object: Literal["list"]
    data: list[ModelInfo]


@functools.cache
def _params_by_modality() -> dict[str, type[BaseModel]]:
    """modality -> its request's params model (app.schemas), read off the JobCreate union."""
    out: dict[str, type[BaseModel]] = {}
    for member in get_args(get_args(JobCreate)[0]):
        modality = get_args(member.model_fields["modality"].annotation)[0]
        params = get_args(member.model_fields["params"].annotation)  # (Params, None)
        out[modality] = next(a for a in params if a is not type(None))
    return out


def _modalities(stage: str) -> list[str]:
    return [str(m) for m in PIPELINES if stage in model_stages(m)]


@functools.cache
def params_schema(stage: str) -> dict[str, Any]:
    """JSON Schema of `params` (app.schemas, the validation itself) of a job of the modality the
    stage is named after: what a job that runs a model of this stage may set, and its bounds."""
    own = _params_by_modality().get(stage)
    if own is None:  # a stage no modality is named after: its jobs' params are another stage's
        return {"type": "object"}
    schema = TypeAdapter(own).json_schema()
    props = {name: _non_null(prop) for name, prop in schema.get("properties", {}).items()}
    return {k: v for k, v in schema.items() if k != "title"} | {"properties": props}


def _non_null(prop: dict[str, Any]) -> dict[str, Any]:
    """A param's own schema: `null` (which only means "the default") and the title left out."""
    out = {k: v for k, v in prop.items() if k not in ("anyOf", "title", "default")}
    for alt in prop.get("anyOf", []):
        if alt.get("type") != "null":
            out |= alt
    return out


def model_swaps() -> Swaps:
    """This app's view of the hot swaps (models.swaps), re-read at most once a second."""
    ext = current_app.extensions
    if "genqueue.swaps" not in ext:
        ext["genqueue.swaps"] = Swaps(services().settings.ratelimit_storage_uri)
    return extension("genqueue.swaps", Swaps)


def _warm() -> Counter[tuple[str, str]] | None:
    ext = current_app.extensions
    if "genqueue.presence" not in ext:
        ext["genqueue.presence"] = presence.client(services().settings.ratelimit_storage_uri)
    conn = ext["genqueue.presence"]
    if conn is None:  # no shared Redis (the embedded mode): nobody announces, so unknown
        return None
    try:
        return presence.warm(conn)
    except redis.RedisError as exc:  # unknown, not cold: the models still serve
        log.warning("cannot read the loaded models: %s", exc)
        return None


def model_resource(
    model: catalog.CatalogModel, plan: Plan, warm: Counter[tuple[str, str]] | None
) -> ModelInfo:
    workers = None if warm is None else warm[(model.stage, model.spec)]
    return ModelInfo(
        object="model",
        id=model.id,
        stage=model.stage,
        modalities=_modalities(model.stage),
        default=model.default,
        source=model.source,
        version=spec_version(model.spec),
        queue=QUEUES[as_stage(model.stage)],
        warm=None if workers is None else workers > 0,
        warm_workers=workers,
        allowed=plan.allows(model.stage, model.id),
        params=params_schema(model.stage),
    )


@bp.get("/models")
def list_models() -> Response:
    """Cheap: the catalog is settings, the warm flags one HGETALL; no worker is asked."""
    settings = model_swaps().effective(services().settings)
    plan = Plan.effective(settings, current_principal().plan_overrides)
    warm = _warm()
    data = [model_resource(m, plan, warm) for m in catalog.configured(settings)]
    return jsonify(ModelList(object="list", data=data).public())
