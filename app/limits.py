"""Per-key request rate limits (flask-limiter, counters in Redis shared by every web process).

Each API key gets its plan's `rate_limit`, e.g. "100/second;3000/minute": a burst over one
second and a sustained rate over a minute, as a sliding window counter (the current and
the previous window's counts, weighted: no double burst at window edges, O(1) in Redis).
Every limited response carries RateLimit-Limit / -Remaining / -Reset (seconds, as the IETF
draft has it) and RateLimit-Policy; a 429 also carries Retry-After. In Redis each limit's hit
returns the window it leaves (app.limit_storage), so the headers cost no second round trip.
If Redis is unreachable the limiter lets requests through (and logs): a limiter outage
must not become an API outage.
"""

from __future__ import annotations

import logging
import math
import time

from flask import Flask, Response, g, request
from flask_limiter import Limiter, RequestLimit

from app import limit_storage
from models.plans import Plan
from models.settings import Settings

log = logging.getLogger("genqueue.api")
EXTENSION = "genqueue.limiter"


def _key() -> str:
    principal = g.get("principal")  # absent only on exempt requests, which are never counted
    return f"key:{principal.key_prefix}" if principal else f"addr:{request.remote_addr}"


def init_app(app: Flask, settings: Settings) -> Limiter:
    """Attach the limiter; app.auth must be registered first (its hook sets the principal)."""

    def rate_for_request() -> str:
        # flask-limiter resolves the limit before it asks whether the request is exempt.
        principal = g.get("principal")
        return Plan.effective(settings, principal.plan_overrides if principal else None).rate_limit

    uri = settings.ratelimit_storage_uri
    if uri.startswith(("redis://", "rediss://")) and settings.ratelimit_strategy == "sliding-window-counter":
        uri = limit_storage.SCHEME + uri  # each hit returns its window: the headers need no read
    redis_options: dict[str, str | int] = {"socket_timeout": 1, "socket_connect_timeout": 1}
    options = redis_options if uri.startswith(("redis", limit_storage.SCHEME)) else {}
    limiter = Limiter(
        _key,
        app=app,
        # Application limits: one budget per key across every route, not one per route.
        application_limits=[rate_for_request],
        application_limits_exempt_when=lambda: g.get("principal") is None,  # public or rejected
        storage_uri=uri,
        storage_options=options,
        strategy=settings.ratelimit_strategy,
        key_prefix="genqueue",
        headers_enabled=False,  # written below in the draft-standard form
        swallow_errors=True,
    )
    app.extensions[EXTENSION] = limiter

    @app.after_request
    def _rate_limit_headers(response: Response) -> Response:
        if g.get("principal") is None:
            return response
        try:
            _set_headers(response, limiter.current_limits)
        except Exception as exc:  # storage down: the request was let through; say nothing
            log.warning("rate-limit headers skipped: %s", type(exc).__name__)
        return response

    return limiter


def _set_headers(response: Response, limits: list[RequestLimit]) -> None:
    if not limits:
        return
    now = time.time()
    # The binding limit: a breached one, else the one with the fewest requests left.
    tightest = min(limits, key=lambda lim: (not lim.breached, lim.remaining))
    reset = max(0, math.ceil(tightest.window.reset_time - now))
    response.headers["RateLimit-Limit"] = str(tightest.limit.amount)
    response.headers["RateLimit-Remaining"] = str(max(0, tightest.remaining))
    response.headers["RateLimit-Reset"] = str(reset)
    response.headers["RateLimit-Policy"] = ", ".join(
        f"{lim.limit.amount};w={lim.limit.get_expiry()}" for lim in limits
    )
    if response.status_code == 429:
        response.headers["Retry-After"] = str(max(1, reset))
