"""Building blocks of the OpenAPI document: references, problem answers, parameters, operations."""

from __future__ import annotations

from typing import Any

REF = "#/components/schemas/{model}"


def problems(*codes: int) -> dict[str, Any]:
    """problem+json answers for these status codes."""
    schema = ref("Problem")
    return {
        str(c): {"description": _REASONS[c], "content": {"application/problem+json": {"schema": schema}}}
        for c in codes
    }


_REASONS = {
    400: "Unparseable JSON body",
    401: "Missing, invalid or revoked API key",
    403: "Beyond the tenant's plan (the limits are named)",
    404: "No such job (or other resource)",
    409: "Conflicting state",
    410: "The job's data was removed (expired, or deleted)",
    413: "Body too large",
    415: "Body is not JSON",
    416: "Range not satisfiable (see Content-Range)",
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


def ref(model: str) -> dict[str, str]:
    return {"$ref": REF.format(model=model)}


def json_answer(model: str, description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {"schema": ref(model)}},
    }
    if headers:
        out["headers"] = headers
    return out


def param(name: str, where: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": schema,
        "description": description,
    }


def op(
    op_id: str,
    summary: str,
    responses: dict[str, Any],
    *params: dict[str, Any],
    db: bool = True,
    auth: bool = True,
) -> Any:
    """One operation; those touching the database or broker may also answer 503, keyed ones (all but
    the public ones, app.auth.PUBLIC_ENDPOINTS and the paths outside /v1) 401/429."""
    if db:
        responses = {**responses, **problems(503)}
        responses["503"]["headers"] = _RETRY_AFTER
    if auth:
        responses = {**responses, **problems(401, 429)}
        responses["401"]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
        responses["429"]["headers"] = _RETRY_AFTER | _RATE_LIMIT
    out: dict[str, Any] = {"operationId": op_id, "summary": summary, "responses": responses}
    out["security"] = [{"bearerAuth": []}] if auth else []
    return out | ({"parameters": list(params)} if params else {})
