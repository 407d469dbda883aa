"""Per-key request rate limits (the `limits` library, counters in Redis shared by every web process).

Each API key gets its plan's `rate_limit`, e.g. "100/second;3000/minute": a burst over one
second and a sustained rate over a minute, as a sliding window counter (the current and
the previous window's counts, weighted: no double burst at window edges, O(1) in Redis).
On Redis with the sliding window counter (the default) a request is counted against all of its
key's limits or, if one is breached, against none; other storages and strategies count limit by
limit up to the breached one (limits' own strategies).
Every limited response carries RateLimit-Limit / -Remaining / -Reset (seconds, as the IETF
draft has it) and RateLimit-Policy; a 429 also carries Retry-After. On Redis, all of a plan's
limits take one script call that also returns the windows the headers read (app.limit_storage).
If the storage is unreachable the request is let through (and logged): a limiter outage
must not become an API outage.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass

from flask import Flask, Response, g
from limits import RateLimitItem, parse_many
from limits.storage import storage_from_string
from limits.strategies import STRATEGIES, RateLimiter

from app import limit_storage
from app.errors import TooManyRequests
from models.plans import Plan
from models.settings import Settings

log = logging.getLogger("genqueue.api")
KEY_PREFIX = "genqueue"
EXTENSION = "genqueue.limiter"
WARN_EVERY_S = 60.0  # with the storage down, one warning a minute per process, not one per request


@functools.lru_cache(maxsize=256)
def _parsed(rate_limit: str) -> tuple[RateLimitItem, ...]:
    return tuple(parse_many(rate_limit))


@dataclass(frozen=True)
class Verdict:
    """One request's standing against each of its limits, as the headers report it."""

    items: tuple[RateLimitItem, ...]
    remaining: tuple[int, ...]
    reset_at: tuple[float, ...]  # epoch seconds
    breached: RateLimitItem | None


class KeyLimiter:
    """Checks and counts a request against its key's limits through a limits strategy."""

    def __init__(self, settings: Settings) -> None:
        uri = settings.ratelimit_storage_uri
        self.one_call = uri.startswith(("redis://", "rediss://")) and (
            settings.ratelimit_strategy == "sliding-window-counter"
        )
        if self.one_call:
            uri = limit_storage.SCHEME + uri  # all limits in one script call, windows kept
        options: dict[str, float | str | bool] = {}
        if uri.startswith(("redis", limit_storage.SCHEME)):
            options = {"socket_timeout": 1, "socket_connect_timeout": 1}
        self.storage = storage_from_string(uri, **options)
        self.strategy: RateLimiter = STRATEGIES[settings.ratelimit_strategy](self.storage)
        self.warned_at = -math.inf

    def hit(self, rate_limit: str, key: str) -> Verdict:
        items, ids = _parsed(rate_limit), (KEY_PREFIX, key)
        if self.one_call:
            assert isinstance(self.storage, limit_storage.PlanWindowsRedisStorage)
            acquired = self.storage.acquire_all(items, ids)
        else:  # one call per limit, up to the first breached (memory:// in embedded mode, other strategies)
            acquired = all(self.strategy.hit(item, *ids) for item in items)
        stats = [self.strategy.get_window_stats(item, *ids) for item in items]
        breached = None
        if not acquired:
            # The limit with no room left; with several, the one that frees up last: a request
            # needs room in all of them, so that is when to retry (Retry-After).
            full = [(st.reset_time, i) for i, st in enumerate(stats) if st.remaining < 1]
            breached = items[max(full)[1]] if full else items[0]
        return Verdict(
            items=items,
            remaining=tuple(s.remaining for s in stats),
            reset_at=tuple(s.reset_time for s in stats),
            breached=breached,
        )


def init_app(app: Flask, settings: Settings) -> KeyLimiter:
    """Attach the limiter; app.auth must be registered first (its hook sets the principal)."""
    limiter = app.extensions[EXTENSION] = KeyLimiter(settings)
    default_rate = Plan.effective(settings, None).rate_limit

    @app.before_request
    def _limit() -> None:
        principal = g.get("principal")
        if principal is None:  # a public route, or a request auth already refused
            return
        rate = (
            Plan.effective(settings, principal.plan_overrides).rate_limit
            if principal.plan_overrides
            else default_rate
        )
        try:
            verdict = limiter.hit(rate, f"key:{principal.key_prefix}")
        except Exception as exc:  # storage down: let the request through, without headers
            if time.monotonic() - limiter.warned_at >= WARN_EVERY_S:
                limiter.warned_at = time.monotonic()
                log.warning("rate limits not checked (%s): requests let through", type(exc).__name__)
            return
        g.rate_verdict = verdict
        if verdict.breached is not None:
            raise TooManyRequests(f"Rate limit exceeded: {verdict.breached}.")

    @app.after_request
    def _rate_limit_headers(response: Response) -> Response:
        verdict: Verdict | None = g.get("rate_verdict")
        if verdict is not None:
            _set_headers(response, verdict)
        return response

    return limiter


def _set_headers(response: Response, verdict: Verdict) -> None:
    now = time.time()
    limits = list(zip(verdict.items, verdict.remaining, verdict.reset_at, strict=True))
    # The binding limit: the breached one, else the one with the fewest requests left.
    tightest = min(limits, key=lambda lim: (lim[0] is not verdict.breached, lim[1]))
    reset = max(0, math.ceil(tightest[2] - now))
    response.headers["RateLimit-Limit"] = str(tightest[0].amount)
    response.headers["RateLimit-Remaining"] = str(max(0, tightest[1]))
    response.headers["RateLimit-Reset"] = str(reset)
    response.headers["RateLimit-Policy"] = ", ".join(
        f"{item.amount};w={item.get_expiry()}" for item in verdict.items
    )
    if response.status_code == 429:
        response.headers["Retry-After"] = str(max(1, reset))
