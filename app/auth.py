"""Bearer API-key authentication for /v1 (one before_request hook) and tenant scoping of job queries."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any, TypeVar

from cachetools import TTLCache
from flask import Flask, current_app, g, request
from sqlalchemy import Select

from app.errors import Unauthorized
from app.services import services
from models import Job, logs
from models.db import read_only
from models.keys import Principal, authenticate, hash_key

log = logging.getLogger("genqueue.api")

# Open without a key: liveness, readiness. /openapi.json, /docs and /metrics are not under /v1.
PUBLIC_ENDPOINTS = frozenset({"health.health", "health.ready"})

_S = TypeVar("_S", bound="Select[*tuple[Any, ...]]")  # a select of any row shape
EXTENSION = "genqueue.keycache"


class KeyCache:
    """Principals of recently seen valid keys, by the key's SHA-256, for `ttl_s` seconds.

    Saves a database lookup on nearly every request; the price is that a revoked key keeps
    working on a process that has just seen it for at most ttl_s. Invalid keys are never cached.
    """

    def __init__(self, ttl_s: float, maxsize: int = 10_000) -> None:
        self._cache: TTLCache[str, Principal] | None = TTLCache(maxsize, ttl_s) if ttl_s > 0 else None
        self._lock = threading.Lock()  # TTLCache is not thread-safe

    def principal(self, token: str) -> Principal | None:
        if self._cache is None:
            return self._lookup(token)
        digest = hash_key(token)
        with self._lock:
            hit = self._cache.get(digest)
        if hit is not None:
            return hit
        found = self._lookup(token)
        if found is not None:
            with self._lock:
                self._cache[digest] = found
        return found

    @staticmethod
    def _lookup(token: str) -> Principal | None:
        with read_only(services().sessions) as s:
            return authenticate(s, token)


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
        raise Unauthorized("An API key is required: send 'Authorization: Bearer <key>'.", error="")
    principal = current_app.extensions[EXTENSION].principal(token)
    if principal is None:
        # Never the key itself in logs or answers: the prefix at most, and only if well formed.
        log.info("rejected API key for %s %s", request.method, request.path)
        raise Unauthorized("The API key is invalid or has been revoked.")
    g.principal = principal
    logs.bind(tenant=principal.tenant_id)


def current_principal() -> Principal:
    principal: Principal | None = g.get("principal")
    if principal is None:  # a view reached without the hook: a programming error, not a 401
        raise RuntimeError("no authenticated principal for this request")
    return principal


def tenant_id() -> uuid.UUID:
    return current_principal().tenant_id


def owned(stmt: _S, model: type[Any] = Job) -> _S:
    """Restrict a query on jobs (or another model with a `tenant_id`) to the caller's tenant:
    another tenant's rows do not exist."""
    return stmt.where(model.tenant_id == tenant_id())


def init_app(app: Flask, auth_cache_s: float) -> None:
    """Register before the rate limiter, so it can key its counters by the authenticated key."""
    app.extensions[EXTENSION] = KeyCache(auth_cache_s)
    app.before_request(_authenticate)
