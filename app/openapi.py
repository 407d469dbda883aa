"""GET /openapi.json (OpenAPI 3.1, schemas from the pydantic models) and GET /docs (plain HTML)."""

from __future__ import annotations

import html
from typing import Any, Literal

from flask import Blueprint, Response, current_app, jsonify
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from app import webhooks_openapi
from app.factory import extension
from app.schemas import ListQuery, job_create_adapter

bp = Blueprint("openapi", __name__)
REF = "#/components/schemas/{model}"
Status = Literal["queued", "running", "succeeded", "failed", "canceled"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobOutputs(_Doc):
    text: str | None
    text_url: str | None
    video_url: str | None
    thumbnail_url: str | None


class JobError(_Doc):
    code: str | None
    message: str | None
    stage: str | None


class JobTimings(_Doc):
    created_at: str | None
    started_at: str | None
    text_completed_at: str | None
    completed_at: str | None
    queue_s: float | None
    text_s: float | None
    video_s: float | None
    gpu_s: float | None


class Job(_Doc):
    """The job resource (models.resource.job_resource)."""

    id: str
    object: Literal["job"]
    status: Status
    stage: Literal["text", "video"] | None
    progress: int = Field(ge=0, le=100)
    queue_position: int | None = Field(description="1-based place among queued jobs; null unless queued.")
    modality: Literal["text", "video"]
    prompt: str
    params: dict[str, Any] = Field(description="Complete: every omitted param filled with its default.")
    priority: Literal["high", "normal", "low"]
    outputs: JobOutputs
    error: JobError | None
    attempts: int = Field(description="Runs of the current stage: retries and redeliveries included.")
    degraded: dict[str, Any] | None = Field(
        description="Set when the video stage was retried at a lower cost: reason, from, to."
    )
    cached: bool = Field(description="Answered from an identical earlier job, not computed again.")
    source_job_id: str | None = Field(description="The identical job a cached one reused; else null.")
    timings: JobTimings
    metadata: dict[str, str]


class JobList(_Doc):
    data: list[Job]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last.")


class FieldError(_Doc):
    field: str = Field(description="Dotted path of the offending field, e.g. `params.width`.")
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details; extension members (e.g. `job_status`, `checks`) may appear."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError]


class Health(_Doc):
    status: Literal["ok"]


class Ready(_Doc):
    status: Literal["ready"]
    checks: dict[str, dict[str, Any]]


def _problems(*codes: int) -> dict[str, Any]:
    ref = {"$ref": REF.format(model="Problem")}
    return {
        str(c): {"description": _REASONS[c], "content": {"application/problem+json": {"schema": ref}}}
        for c in codes
    }


_REASONS = {
    400: "Unparseable JSON body",
    401: "Missing, invalid or revoked API key",
    403: "Beyond the tenant's plan (the limits are named)",
    404: "No such job (or other resource)",
    409: "Conflicting state",
    413: "Body too large",
    415: "Body is not JSON",
    422: "Validation failed",
    429: "Rate limit or concurrency quota exceeded (see Retry-After)",
    503: "Database or broker unavailable, or the service is overloaded (see Retry-After)",
}
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}}
_INT = {"schema": {"type": "integer"}}
_RATE_LIMIT = {
    "RateLimit-Limit": _INT | {"description": "Requests allowed in the binding window."},
    "RateLimit-Remaining": _INT | {"description": "Requests left in it."},
    "RateLimit-Reset": _INT | {"description": "Seconds until it resets."},
    "RateLimit-Policy": {"schema": {"type": "string"}, "description": "Every limit: `100;w=1, 3000;w=60`."},
}


def _ref(model: str) -> dict[str, str]:
    return {"$ref": REF.format(model=model)}


def _json(model: str, description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": _ref(model)}},
    }
    if headers:
        out["headers"] = headers
    return out


def _schemas() -> dict[str, Any]:
    """Every named schema, with pydantic's $defs hoisted into components."""
    out: dict[str, Any] = {}
    named: list[tuple[str, Any, Literal["validation", "serialization"]]] = [
        ("JobCreate", job_create_adapter, "validation"),
        *[(m.__name__, TypeAdapter(m), "serialization") for m in (Job, JobList, Problem, Health, Ready)],
        *[(m.__name__, TypeAdapter(m), "validation") for m in webhooks_openapi.REQUESTS],
        *[(m.__name__, TypeAdapter(m), "serialization") for m in webhooks_openapi.MODELS],
    ]
    for name, adapter, mode in named:
        schema = adapter.json_schema(ref_template=REF, mode=mode)
        out.update(schema.pop("$defs", {}))
        out[name] = schema
    return out


def _param(name: str, where: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": schema,
        "description": description,
    }


def _op(
    op_id: str,
    summary: str,
    responses: dict[str, Any],
    *params: dict[str, Any],
    db: bool = True,
    auth: bool = False,
) -> Any:
    """One operation; those touching the database or broker may also answer 503, keyed ones 401/429."""
    if db:
        responses = {**responses, **_problems(503)}
        responses["503"]["headers"] = _RETRY_AFTER
    if auth:
        responses = {**responses, **_problems(401, 429)}
        responses["401"]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
        responses["429"]["headers"] = _RETRY_AFTER | _RATE_LIMIT
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "responses": responses}
    op["security"] = [{"bearerAuth": []}] if auth else []
    return op | ({"parameters": list(params)} if params else {})


def _paths() -> dict[str, Any]:
    job_id = _param("job_id", "path", {"type": "string", "format": "uuid"})
    text = {"type": "string"}
    query = ListQuery.model_json_schema()["properties"]
    listing = [_param(n, "query", s, s.get("description", "")) for n, s in query.items()]
    variants = {"type": "string", "enum": ["video", "text", "thumbnail"]}
    variant = _param("variant", "query", variants, "Default: video for video jobs, text for text jobs.")
    binary = {
        t: {"schema": {"type": "string", "format": "binary"}}
        for t in ("video/mp4", "image/jpeg", "text/plain")
    }
    submit = _op(
        "submitJob",
        "Submit a job",
        {
            "202": _json("Job", "Accepted and queued", {"Location": {"schema": text}}),
            **_problems(400, 403, 413, 415, 422),
        },
        _param(
            "Idempotency-Key",
            "header",
            {"type": "string", "minLength": 1, "maxLength": 255},
            "Kept 24 h: a repeat with the same body returns the original job "
            "(header Idempotent-Replayed: true); with another body, 422.",
        ),
        auth=True,
    )
    job_link = {"parameters": {"job_id": "$response.body#/id"}}
    submit["responses"]["202"]["links"] = {
        "GetJob": {"operationId": "getJob", **job_link},
        "CancelJob": {"operationId": "cancelJob", **job_link},
        "GetJobContent": {"operationId": "getJobContent", **job_link},
    }
    submit["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref("JobCreate")}}}
    return webhooks_openapi.paths() | {
        "/v1/jobs": {
            "post": submit,
            "get": _op(
                "listJobs",
                "List jobs, newest first",
                {"200": _json("JobList", "A page of jobs"), **_problems(422)},
                *listing,
                auth=True,
            ),
        },
        "/v1/jobs/{job_id}": {
            "get": _op(
                "getJob",
                "Get a job",
                {
                    "200": _json("Job", "The job", {"ETag": {"schema": text}}),
                    "304": {"description": "Not modified"},
                    **_problems(404),
                },
                job_id,
                _param("If-None-Match", "header", text),
                auth=True,
            )
        },
        "/v1/jobs/{job_id}/cancel": {
            "post": _op(
                "cancelJob",
                "Cancel a job (idempotent)",
                {"200": _json("Job", "Canceled (now or before)"), **_problems(404, 409)},
                job_id,
                auth=True,
            )
        },
        "/v1/jobs/{job_id}/content": {
            "get": _op(
                "getJobContent",
                "Download the job's text, video or thumbnail",
                {
                    "200": {"description": "The bytes", "content": binary},
                    "206": {"description": "Partial content (Range)", "content": binary},
                    "304": {"description": "Not modified"},
                    **_problems(404, 409, 422),
                },
                job_id,
                variant,
                _param("Range", "header", text),
                auth=True,
            )
        },
        "/v1/health": {"get": _op("health", "Liveness", {"200": _json("Health", "Alive")}, db=False)},
        "/v1/ready": {
            "get": _op("ready", "Readiness: database and broker", {"200": _json("Ready", "Ready")})
        },
        "/openapi.json": {
            "get": _op("openapi", "This document", {"200": {"description": "OpenAPI 3.1"}}, db=False)
        },
        "/docs": {
            "get": _op(
                "docs",
                "API reference for humans",
                {"200": {"description": "HTML", "content": {"text/html": {}}}},
                db=False,
            )
        },
        "/metrics": {
            "get": _op(
                "metrics",
                "Prometheus metrics",
                {"200": {"description": "Prometheus text format", "content": {"text/plain": {}}}},
                db=False,
            )
        },
    }


def build_spec(base_url: str = "") -> dict[str, Any]:
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
        "paths": _paths(),
        "components": {
            "schemas": _schemas(),
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
        ext["genqueue.openapi"] = build_spec(ext["genqueue"].settings.public_base_url.rstrip("/"))
    return extension("genqueue.openapi", dict)


@bp.get("/openapi.json")
def openapi_json() -> Response:
    return jsonify(_spec())


@bp.get("/docs")
def docs() -> Response:
    rows = "".join(
        f"<tr><td><code>{html.escape(method.upper())}</code></td><td><code>{html.escape(path)}</code></td>"
        f"<td>{html.escape(op.get('summary', ''))}</td></tr>"
        for path, ops in _spec()["paths"].items()
        for method, op in ops.items()
    )
    page = (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>Genqueue API</title></head><body>"
        "<h1>Genqueue API</h1><p>Machine-readable: <a href=openapi.json>/openapi.json</a> (OpenAPI 3.1).</p>"
        f"<table><tr><th>Method</th><th>Path</th><th>Summary</th></tr>{rows}</table></body></html>"
    )
    return Response(page, mimetype="text/html")
