"""Bearer API-key authentication for /v1 (one before_request hook) and tenant scoping of job queries."""

from __future__ import annotations

import logging
import uuid
from typing import Any, TypeVar

from flask import Flask, g, request
from sqlalchemy import Select

from app import services
from app.errors import Unauthorized
from models import Job
from models.db import read_only
from models.keys import Principal, authenticate

log = logging.getLogger("genqueue.api")

# Open without a key: liveness, readiness. /openapi.json, /docs and /metrics are not under /v1.
PUBLIC_ENDPOINTS = frozenset({"health.health", "health.ready"})

_S = TypeVar("_S", bound=Select)  # type: ignore[type-arg]


def _needs_key() -> bool:
    # request.endpoint is None when routing failed: the 404/405 answer reveals nothing.
    return (
        request.endpoint is not None
        and request.path.startswith("/v1/")
        and request.endpoint not in PUBLIC_ENDPOINTS
    )


def _authenticate() -> None:
    if not _needs_key():
        return
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized(
            "An API key is required: send 'Authorization: Bearer <key>'.", error=""
        )
    with read_only(services().sessions) as s:
        principal = authenticate(s, token)
    if principal is None:
        # Never the key itself in logs or answers: the prefix at most, and only if well formed.
        log.info("rejected API key for %s %s", request.method, request.path)
        raise Unauthorized("The API key is invalid or has been revoked.")
    g.principal = principal


def current_principal() -> Principal:
    principal: Principal | None = g.get("principal")
    if principal is None:  # a view reached without the hook: a programming error, not a 401
        raise RuntimeError("no authenticated principal for this request")
    return principal


def tenant_id() -> uuid.UUID:
    return current_principal().tenant_id  # type: ignore[no-any-return]


def owned(stmt: _S, model: type[Any] = Job) -> _S:
    """Restrict a query on jobs (or another model with a `tenant_id`) to the caller's tenant:
    another tenant's rows do not exist."""
    return stmt.where(model.tenant_id == tenant_id())


def init_app(app: Flask) -> None:
    """Register before the rate limiter, so it can key its counters by the authenticated key."""
    app.before_request(_authenticate)
