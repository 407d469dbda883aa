"""Typed client errors: an RFC 9457 problem+json answer becomes the class its `type` names.

The server's problem types are `tag:genqueue,2025:problem:<slug>`; a class here lists the slugs
it stands for, and a type this version does not know (a newer server) falls back to the class
of its status (`NotFound` for any 404, `ClientError`/`ServerError` past that), so the mapping
never has to copy the server's class hierarchy and never breaks on a new type.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar

PROBLEM_BASE = "tag:genqueue,2025:problem:"


class GenqueueError(Exception):
    """Anything this client raises."""


class TransportError(GenqueueError):
    """The server could not be reached or the connection broke (after the retries)."""


class WaitTimeout(GenqueueError):
    """`wait` gave up before the job finished; the job goes on."""


class APIError(GenqueueError):
    """The server answered with an error: the problem's members, and the answer's headers."""

    status_code: ClassVar[int | None] = None  # the status this class stands for (None: several)
    slugs: ClassVar[tuple[str, ...]] = ()  # the problem types it stands for

    def __init__(self, status: int, problem: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        self.status = status
        self.problem = dict(problem)
        self.type: str = str(problem.get("type") or "about:blank")
        self.title: str = str(problem.get("title") or "")
        self.detail: str = str(problem.get("detail") or self.title or f"HTTP {status}")
        self.errors: list[dict[str, Any]] = list(problem.get("errors") or [])
        self.headers = dict(headers)
        self.request_id: str | None = self.headers.get("x-request-id")
        fields = ", ".join(f"{e.get('field')}: {e.get('message')}" for e in self.errors[:5])
        super().__init__(f"{status} {self.detail}" + (f" ({fields})" if fields else ""))

    @property
    def slug(self) -> str | None:
        """The type's last part (`validation-failed`), None for about:blank or a foreign type."""
        return self.type[len(PROBLEM_BASE) :] if self.type.startswith(PROBLEM_BASE) else None

    @property
    def retry_after(self) -> float | None:
        return parse_retry_after(self.headers.get("retry-after"))


class ClientError(APIError):
    """A 4xx: the request was refused; sending it again unchanged will not help (but see 429)."""


class ServerError(APIError):
    """A 5xx: the server failed; it may work later."""


class BadRequest(ClientError):
    status_code, slugs = 400, ("malformed-request",)


class Unauthorized(ClientError):
    status_code, slugs = 401, ("unauthorized",)


class Forbidden(ClientError):
    status_code = 403
    slugs: ClassVar[tuple[str, ...]] = ("forbidden",)


class PlanLimitExceeded(Forbidden):
    slugs = ("plan-limit",)

    @property
    def limits(self) -> dict[str, Any]:
        return dict(self.problem.get("limits") or {})


class InvalidLink(Forbidden):
    slugs = ("invalid-link", "expired-link")


class NotFound(ClientError):
    status_code, slugs = 404, ("not-found",)


class Conflict(ClientError):
    status_code, slugs = 409, ("conflict",)

    @property
    def job_status(self) -> str | None:
        return self.problem.get("job_status")


class Gone(ClientError):
    """The job's data expired or was deleted."""

    status_code, slugs = 410, ("data-removed",)


class PayloadTooLarge(ClientError):
    status_code, slugs = 413, ("payload-too-large",)


class UnsupportedMediaType(ClientError):
    status_code, slugs = 415, ("unsupported-media-type",)


class ValidationFailed(ClientError):
    """422: `errors` names each field at fault (`params.width`)."""

    status_code, slugs = 422, ("validation-failed",)


class RateLimited(ClientError):
    """429 after the retries: the key's rate, the tenant's concurrency quota or stream cap."""

    status_code, slugs = 429, ("rate-limited",)


class QuotaExceeded(RateLimited):
    slugs = ("concurrency-limit",)


class ServiceUnavailable(ServerError):
    status_code, slugs = 503, ("service-unavailable",)


class Overloaded(ServiceUnavailable):
    """Admission control turned the job away (`stage` names the stage behind)."""

    slugs = ("overloaded",)


def _classes(root: type[APIError]) -> list[type[APIError]]:
    out: list[type[APIError]] = []
    for sub in root.__subclasses__():
        out += [sub, *_classes(sub)]
    return out


def _tables() -> tuple[dict[str, type[APIError]], dict[int, type[APIError]]]:
    by_slug: dict[str, type[APIError]] = {}
    by_status: dict[int, type[APIError]] = {}
    for cls in _classes(APIError):
        by_slug.update(dict.fromkeys(cls.slugs, cls))
        if cls.status_code is not None and "status_code" in cls.__dict__:  # where it is declared
            by_status.setdefault(cls.status_code, cls)
    return by_slug, by_status


BY_SLUG, BY_STATUS = _tables()


def error_class(status: int, problem_type: str | None) -> type[APIError]:
    """The class for an answer: by the problem type, else by status, else 4xx/5xx."""
    if problem_type and problem_type.startswith(PROBLEM_BASE):
        cls = BY_SLUG.get(problem_type[len(PROBLEM_BASE) :])
        if cls is not None:
            return cls
    if status in BY_STATUS:
        return BY_STATUS[status]
    return ServerError if status >= 500 else ClientError


def from_response(status: int, body: bytes, headers: Mapping[str, str]) -> APIError:
    """The error for an error answer; a body that is not problem+json still gets its status's class."""
    try:
        problem = json.loads(body) if body else {}
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    if not problem.get("detail") and body and not problem:
        problem = {"detail": body[:200].decode("utf-8", "replace")}
    lowered = {k.lower(): v for k, v in headers.items()}
    return error_class(status, problem.get("type"))(status, problem, lowered)


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds: the delta form the server sends, or an HTTP date (a proxy's)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None
