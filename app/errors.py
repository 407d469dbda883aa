"""API errors and the one handler that renders every failure as RFC 9457 problem+json."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args

from flask import Flask, Response, g, has_request_context, json
from pydantic import BaseModel, Field
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES

from models.redaction import redact
from models.resource import Resource
from tasks.contract.transient import is_transient  # one definition with the workers' retries

log = logging.getLogger("genqueue.api")

PROBLEM_JSON = "application/problem+json"
# Problem types are identifiers, not links (RFC 9457 3.1.1 allows non-resolvable URIs);
# plain HTTP failures use "about:blank", whose title is the status phrase.
PROBLEM_BASE = "tag:genqueue,2025:problem:"
RETRY_AFTER_S = 5

# Why a rejection happened, beyond its type: a fixed vocabulary (it becomes a metric label,
# app/metrics.py), never free text. "" for types with a single cause.
Reason = Literal[
    "",
    "rate",  # 429: the key's request rate limit
    "active_jobs",  # 429: the tenant's queued + running jobs cap
    "streams",  # 429 / 503: the tenant's / the process's concurrent event streams cap
    "text_backlog",  # 503: admission, the text stage's backlog is over its bound
    "video_backlog",  # 503: admission, the video stage's backlog is over its bound
    "image_backlog",  # 503: admission, the image stage's backlog is over its bound
    "estimated_wait",  # 503: admission, the estimated wait is over its bound
    "dependency",  # 503: the database or the broker failed transiently
    "broker",  # 503: a submitted job could not be published
    "not_ready",  # 503: /v1/ready found a dependency down
]
REASONS: frozenset[str] = frozenset(get_args(Reason))


class ApiError(Exception):
    """An error the client may act on; subclasses fix status, title and type."""

    status = 500
    title = "Internal Server Error"
    slug: str | None = None  # None: about:blank
    default_reason: Reason = ""

    def __init__(
        self,
        detail: str | None = None,
        *,
        errors: Iterable[Mapping[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
        reason: Reason | None = None,
    ) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.reason: Reason = self.default_reason if reason is None else reason
        self.errors = [{"field": e["field"], "message": e["message"]} for e in errors]
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    @property
    def type(self) -> str:
        return f"{PROBLEM_BASE}{self.slug}" if self.slug else "about:blank"


class BadRequest(ApiError):
    status, title, slug = 400, "Bad Request", "malformed-request"


class Unauthorized(ApiError):
    status, title, slug = 401, "Unauthorized", "unauthorized"

    def __init__(self, detail: str | None = None, *, error: str = "invalid_token", **kw: Any) -> None:
        super().__init__(detail, **kw)
        # RFC 6750: say which scheme to use (and, once a token was sent, that it was bad).
        challenge = 'Bearer realm="genqueue"' + (f', error="{error}"' if error else "")
        self.headers.setdefault("WWW-Authenticate", challenge)


class Forbidden(ApiError):
    status, title, slug = 403, "Forbidden", "forbidden"


class PlanLimitExceeded(Forbidden):
    slug = "plan-limit"


class NotFound(ApiError):
    status, title, slug = 404, "Not Found", "not-found"


class Conflict(ApiError):
    status, title, slug = 409, "Conflict", "conflict"


class Gone(ApiError):
    status, title, slug = 410, "Gone", "data-removed"


class PayloadTooLarge(ApiError):
    status, title, slug = 413, "Content Too Large", "payload-too-large"


class UnsupportedMediaType(ApiError):
    status, title, slug = 415, "Unsupported Media Type", "unsupported-media-type"


class ValidationFailed(ApiError):
    status, title, slug = 422, "Validation Failed", "validation-failed"


class TooManyRequests(ApiError):
    status, title, slug = 429, "Too Many Requests", "rate-limited"
    default_reason: Reason = "rate"

    def __init__(self, detail: str | None = None, *, retry_after: int | None = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        if retry_after is not None:
            self.headers.setdefault("Retry-After", str(max(1, retry_after)))


class QuotaExceeded(TooManyRequests):
    slug = "concurrency-limit"
    default_reason: Reason = "active_jobs"


class ServiceUnavailable(ApiError):
    status, title, slug = 503, "Service Unavailable", "service-unavailable"
    default_reason: Reason = "dependency"

    def __init__(self, detail: str | None = None, *, retry_after: int = RETRY_AFTER_S, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.headers.setdefault("Retry-After", str(retry_after))


class Overloaded(ServiceUnavailable):
    slug = "overloaded"


class FieldError(Resource):
    field: str = Field(description="Dotted path of the offending field, e.g. `params.width`.")
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details; extension members (e.g. `job_status`, `checks`) may appear."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError]


def _masked(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


def problem_response(err: ApiError) -> Response:
    # A key pasted into a path, a field name or a value comes back in detail or errors
    # ("No job with id ...", an unknown field): masked like the logs, whatever raised it.
    problem = Problem(
        type=err.type,
        title=err.title,
        status=err.status,
        detail=redact(err.detail),
        errors=[FieldError(field=redact(e["field"]), message=redact(e["message"])) for e in err.errors],
    )
    body = {**{k: _masked(v) for k, v in err.extra.items()}, **problem.model_dump(mode="json")}
    resp = Response(json.dumps(body), status=err.status, mimetype=PROBLEM_JSON)
    resp.headers.update(err.headers)
    return resp


def _from_http(exc: HTTPException) -> ApiError:
    """werkzeug's own errors (unknown route, wrong method, body over MAX_CONTENT_LENGTH...)."""
    code = exc.code or 500
    mapped: dict[int, type[ApiError]] = {
        400: BadRequest,
        401: Unauthorized,
        403: Forbidden,
        404: NotFound,
        409: Conflict,
        413: PayloadTooLarge,
        415: UnsupportedMediaType,
        429: TooManyRequests,  # app.limits raises its own; this maps any other 429
    }
    cls = mapped.get(code)
    # Keep headers such as Allow (405) or WWW-Authenticate; the body is ours.
    headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
    if cls is not None:
        return cls(exc.description, headers=headers)
    err = ApiError(exc.description, headers=headers)
    err.status, err.title = code, HTTP_STATUS_CODES.get(code, "Error")
    return err


def to_api_error(exc: BaseException) -> ApiError:
    """Map any exception to the error the client sees. Internals never reach the body."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, HTTPException):
        return _from_http(exc)
    if is_transient(exc):
        log.warning("dependency unavailable: %s: %s", type(exc).__name__, exc)
        return ServiceUnavailable("A backing service (database or queue) is unavailable; retry shortly.")
    log.exception("unhandled error", exc_info=exc)
    return ApiError("An unexpected error occurred; it has been logged.")


def handle_error(exc: Exception) -> Response | HTTPException:
    if isinstance(exc, HTTPException) and exc.code is not None and exc.code < 400:
        return exc  # redirects raised by routing are not errors
    err = to_api_error(exc)
    if has_request_context():
        g.problem = err  # counted by type and reason when the response goes out (app.metrics)
    return problem_response(err)


def register_error_handler(app: Flask) -> None:
    """The single error handler: Flask routes HTTPExceptions here too."""
    app.register_error_handler(Exception, handle_error)
