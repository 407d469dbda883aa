"""GET /openapi.json (OpenAPI 3.1, schemas from the pydantic models) and GET /docs (Swagger UI over it)."""

from __future__ import annotations

from typing import Any, Literal

from flask import Blueprint, Response, current_app, jsonify
from pydantic import BaseModel, TypeAdapter

from app import api_docs, openapi_rules, webhook_resources, webhooks_openapi
from app.downloads import CONTENT_VARIANTS
from app.errors import Problem
from app.events_openapi import paths as events_paths
from app.health import Health, Ready
from app.models_api import ModelList
from app.openapi_examples import TAGS, add_examples, add_tags
from app.openapi_parts import REF, json_answer, op, param, problems, ref
from app.schemas import BATCH_MAX, JobBatchCreate, job_create_adapter
from app.services import extension
from models.events import JobEvent, JobEventList
from models.media_links import IMAGE_FORMATS, OUTPUT_VARIANTS, VARIANTS
from models.resource import Job, JobBatch, JobList
from models.settings import Settings
from models.usage import Usage

bp = Blueprint("openapi", __name__)
# The models the endpoints serialize their answers with: the document's schemas are theirs.
RESPONSES: tuple[type[BaseModel], ...] = (
    *(Job, JobList, JobBatch, Problem, Health, Ready, Usage),
    *webhook_resources.MODELS,
    *(JobEvent, JobEventList),
    ModelList,
)


def _schemas(settings: Settings) -> dict[str, Any]:
    """Every named schema, with pydantic's $defs hoisted into components."""
    out: dict[str, Any] = {}
    named: list[tuple[str, Any, Literal["validation", "serialization"]]] = [
        ("JobCreate", job_create_adapter, "validation"),
        ("JobBatchCreate", TypeAdapter(JobBatchCreate), "validation"),
        *[(m.__name__, TypeAdapter(m), "serialization") for m in RESPONSES],
        *[(m.__name__, TypeAdapter(m), "validation") for m in webhooks_openapi.REQUESTS],
    ]
    for name, adapter, mode in named:
        schema = adapter.json_schema(ref_template=REF, mode=mode)
        out.update(schema.pop("$defs", {}))
        out[name] = schema
    openapi_rules.tighten(out)
    openapi_rules.model_choices(out, settings)
    return out


def _paths() -> dict[str, Any]:
    job_id = param("job_id", "path", {"type": "string", "format": "uuid"})
    text = {"type": "string"}
    listing = openapi_rules.query_params()
    variants = {"type": "string", "enum": list(CONTENT_VARIANTS)}
    variant = param(
        "variant",
        "query",
        variants,
        "Default: the job's modality (video, image), text for text jobs (empty: 422). `image` takes "
        "`index` and `format`. `webm`, `preview`, `upscale`: a video job's output variants "
        "(params.variants): 404 when not asked for or failed, 409 while being made.",
    )
    image_index = param(
        "index",
        "query",
        {"type": "string", "pattern": "^[0-9]{1,2}$"},
        "variant=image: which image, from 0 (default) to num_images - 1; beyond: 404.",
    )
    formats = {"type": "string", "enum": list(IMAGE_FORMATS)}
    image_format = param("format", "query", formats, "variant=image: png (default) or webp.")
    # A signed link names the file variant: an image job's are image-<index>.<png|webp>.
    signed_variants = {
        "type": "string",
        "pattern": f"^({'|'.join((*VARIANTS, *OUTPUT_VARIANTS))}|image-[0-9]\\.(png|webp))$",
    }
    unsatisfiable = problems(416)
    unsatisfiable["416"]["headers"] = {"Content-Range": {"schema": text, "description": "`bytes */<size>`"}}
    binary = {
        t: {"schema": {"type": "string", "format": "binary"}}
        for t in ("video/mp4", "video/webm", "image/jpeg", "image/png", "image/webp", "text/plain")
    }
    submitted = {
        "Location": {"schema": text, "description": "The job's URL."},
        "Idempotent-Replayed": {
            "schema": {"type": "string", "enum": ["true"]},
            "description": "Present on an Idempotency-Key replay: the job is the original one.",
        },
    }
    submit = op(
        "submitJob",
        "Submit a job",
        {
            "200": json_answer(
                "Job",
                "Finished already: answered from the cache, finished within `Prefer: wait`, or the "
                "Idempotency-Key replay of a finished job",
                submitted,
            ),
            "202": json_answer(
                "Job", "Queued (or the Idempotency-Key replay of an unfinished job)", submitted
            ),
            **problems(400, 403, 413, 415, 422),
        },
        param(
            "Idempotency-Key",
            "header",
            {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
            "Printable ASCII. Kept 24 h: a repeat with the same body returns the original job "
            "(header Idempotent-Replayed: true); with another body, 422.",
        ),
        param(
            "Prefer",
            "header",
            text,
            "RFC 7240 `wait=N`: hold the answer up to N s (at most `max_wait_s`, 30) for the job to "
            "finish, then answer 200 with the finished job (else 202). Other preferences are ignored.",
        ),
    )
    job_link = {"parameters": {"job_id": "$response.body#/id"}}
    for code in ("200", "202"):
        submit["responses"][code]["links"] = {
            "GetJob": {"operationId": "getJob", **job_link},
            "CancelJob": {"operationId": "cancelJob", **job_link},
            "DeleteJob": {"operationId": "deleteJob", **job_link},
            "GetJobContent": {"operationId": "getJobContent", **job_link},
            "GetJobEvents": {"operationId": "getJobEvents", **job_link},
        }
    submit["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref("JobCreate")}}}
    paths = (
        webhooks_openapi.paths()
        | events_paths()
        | {
            "/v1/jobs": {
                "post": submit,
                "get": op(
                    "listJobs",
                    "List jobs, newest first",
                    {"200": json_answer("JobList", "A page of jobs"), **problems(422)},
                    *listing,
                ),
            },
            "/v1/jobs/{job_id}": {
                "get": op(
                    "getJob",
                    "Get a job",
                    {
                        "200": json_answer("Job", "The job", {"ETag": {"schema": text}}),
                        "304": {"description": "Not modified"},
                        **problems(404),
                    },
                    job_id,
                    param("If-None-Match", "header", text),
                ),
                "delete": op(
                    "deleteJob",
                    "Delete a job's data (idempotent): cancel it if active, remove its outputs, prompt and "
                    "files; the job stays listed, `data_removed: true`, and counts in usage",
                    {"204": {"description": "Deleted (now or before)"}, **problems(404)},
                    job_id,
                ),
            },
            "/v1/jobs/{job_id}/cancel": {
                "post": op(
                    "cancelJob",
                    "Cancel a job (idempotent)",
                    {"200": json_answer("Job", "Canceled (now or before)"), **problems(404, 409)},
                    job_id,
                )
            },
            "/v1/jobs/{job_id}/content": {
                "get": op(
                    "getJobContent",
                    "Download the job's text, video, image or thumbnail",
                    {
                        "200": {"description": "The bytes", "content": binary},
                        "206": {
                            "description": "Partial content (Range)",
                            "content": binary,
                            "headers": {"Content-Range": {"schema": text}},
                        },
                        "304": {"description": "Not modified"},
                        **problems(404, 409, 410, 422),
                        **unsatisfiable,
                    },
                    job_id,
                    variant,
                    image_index,
                    image_format,
                    param("Range", "header", text),
                )
            },
            "/v1/usage": {
                "get": op(
                    "getUsage",
                    "The calling tenant's usage: jobs by outcome, GPU seconds, tokens, frames, cache hits",
                    {
                        "200": json_answer("Usage", "Usage of the jobs submitted in the window"),
                        **problems(422),
                    },
                    *openapi_rules.usage_params(),
                )
            },
            "/v1/models": {
                "get": op(
                    "listModels",
                    "The models a job may name (`model`): stage, default, params, version, queue, warm",
                    {"200": json_answer("ModelList", "Every configured model")},
                )
            },
            "/v1/media/{job_id}/{variant}": {"get": _media(job_id, signed_variants, binary, unsatisfiable)},
            "/v1/health": {
                "get": op("health", "Liveness", {"200": json_answer("Health", "Alive")}, db=False, auth=False)
            },
            "/v1/ready": {
                "get": op(
                    "ready",
                    "Readiness: database and broker",
                    {"200": json_answer("Ready", "Ready")},
                    auth=False,
                )
            },
            "/openapi.json": {
                "get": op(
                    "openapi", "This document", {"200": {"description": "OpenAPI 3.1"}}, db=False, auth=False
                )
            },
            "/docs": {
                "get": op(
                    "docs",
                    "API reference for humans (this page)",
                    {"200": {"description": "HTML", "content": {"text/html": {}}}},
                    db=False,
                    auth=False,
                )
            },
            "/docs/assets/{name}": {
                "get": op(
                    "docsAsset",
                    "A stylesheet or script of /docs (cached for a year: the URL carries its version)",
                    {
                        "200": {
                            "description": "The file",
                            "content": {"text/css": {}, "text/javascript": {}},
                            "headers": {"Cache-Control": {"schema": text}, "ETag": {"schema": text}},
                        },
                        "304": {"description": "Not modified"},
                        **problems(404),
                    },
                    param("name", "path", {"type": "string", "enum": list(api_docs.ASSETS)}),
                    param("v", "query", text, "The assets' version; any value serves the same file."),
                    param("If-None-Match", "header", text),
                    db=False,
                    auth=False,
                )
            },
            "/metrics": {
                "get": op(
                    "metrics",
                    "Prometheus metrics",
                    {"200": {"description": "Prometheus text format", "content": {"text/plain": {}}}},
                    db=False,
                    auth=False,
                )
            },
        }
    )
    paths["/v1/jobs/batch"] = {"post": _batch(submit["parameters"][0])}
    add_examples(paths)
    add_tags(paths)
    return paths


def _batch(idempotency_key: dict[str, Any]) -> Any:
    """POST /v1/jobs/batch: its jobs' schema is POST /v1/jobs's, its Idempotency-Key the same."""
    operation = op(
        "submitJobBatch",
        f"Submit up to {BATCH_MAX} jobs at once: all accepted, or none",
        {
            "202": json_answer(
                "JobBatch",
                "Accepted: the jobs in the order given (or the Idempotency-Key replay of the batch)",
                {
                    "Idempotent-Replayed": {
                        "schema": {"type": "string", "enum": ["true"]},
                        "description": "Present on an Idempotency-Key replay: the original jobs.",
                    }
                },
            ),
            **problems(400, 403, 413, 415, 422),
        },
        {
            **idempotency_key,
            "description": "As on POST /v1/jobs, for the whole batch: a repeat with the same body "
            "returns the same jobs; with another body, 422.",
        },
    )
    operation["description"] = (
        "Each job is validated, limited by the plan, counted by the quota (a batch of 50 takes 50 "
        "slots) and the admission bounds, cached and run exactly as if submitted alone; errors name "
        "the job by index (`jobs[3].params.width`). The request counts once against the rate limit."
    )
    body = {"schema": ref("JobBatchCreate")}
    operation["requestBody"] = {"required": True, "content": {"application/json": body}}
    return operation


def _media(job_id: Any, variants: Any, binary: Any, unsatisfiable: Any) -> Any:
    """A signed link (outputs.*_signed_url): no API key; HEAD and Range too; CORS when configured."""
    text, integer = {"type": "string"}, {"type": "integer"}
    cache = {
        "ETag": {"schema": text},
        "Cache-Control": {"schema": text, "description": "`public, max-age=<seconds until expires>`"},
    }
    forbidden = problems(403)
    forbidden["403"]["description"] = "The signature does not match (altered link, retired key) or it expired"
    gone = problems(404, 410)
    gone["404"]["description"] = "The job or its output no longer exists, or signed links are off"
    found = {"description": "The bytes", "content": binary, "headers": cache}
    partial = {
        "description": "Partial content (Range)",
        "content": binary,
        "headers": {**cache, "Content-Range": {"schema": text}},
    }
    operation = op(
        "getSignedMedia",
        "Download a job's output through a signed, expiring link (no API key)",
        {
            "200": found,
            "206": partial,
            "302": {
                "description": "With `storage_s3_presigned_links` (video and thumbnail): the bytes are at "
                "a presigned S3 URL that expires with the link",
                "headers": {**cache, "Location": {"schema": text}},
            },
            "304": {"description": "Not modified"},
            **forbidden,
            **gone,
            **unsatisfiable,
        },
        job_id,
        param("variant", "path", variants),
        {**param("expires", "query", integer, "Unix time the link expires at."), "required": True},
        {**param("sig", "query", text, "The link's signature."), "required": True},
        param("Range", "header", text),
        auth=False,
    )
    return operation


def build_spec(settings: Settings, base_url: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "Genqueue",
            "version": "1.0.0",
            "description": (
                "Text and video generation jobs. Every /v1 operation but health and ready needs an API "
                "key. Errors are RFC 9457 application/problem+json."
            ),
        },
        "tags": TAGS,
        "paths": _paths(),
        "components": {
            "schemas": _schemas(settings),
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key: `Authorization: Bearer gq_...` (see `genqueue keys create`).",
                }
            },
        },
        "security": [{"bearerAuth": []}],
    }
    if base_url:
        spec["servers"] = [{"url": base_url}]
    return spec


def _spec() -> dict[str, Any]:
    ext = current_app.extensions
    if "genqueue.openapi" not in ext:  # built on first request, not at import or app creation
        settings = ext["genqueue"].settings
        ext["genqueue.openapi"] = build_spec(settings, settings.public_base_url.rstrip("/"))
    return extension("genqueue.openapi", dict)


@bp.get("/openapi.json")
def openapi_json() -> Response:
    return jsonify(_spec())


@bp.get("/docs")
def docs() -> Response:
    resp = Response(api_docs.page(_spec()["paths"]), mimetype="text/html")
    resp.headers["Content-Security-Policy"] = api_docs.csp(current_app.extensions["genqueue"].settings)
    return resp
