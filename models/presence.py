"""Which models the worker processes have loaded, announced in one Redis hash (GET /v1/models `warm`).

Each worker process writes its own field (host:pid) with what it has loaded and until when the
announcement holds; it rewrites it after every load or unload and every `model_heartbeat_s`. A
process that dies stops rewriting, and its field counts for nothing once that time passes (the
next writer deletes it). Readers get the whole hash in one HGETALL: O(worker processes), so the
web reads it per request and never asks the workers themselves (Celery remote control).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import redis

KEY = "genqueue:models:loaded"


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def client(url: str) -> redis.Redis | None:
    """A client of the shared Redis; None when there is none (the embedded mode's `memory://`)."""
    if not url.startswith(REDIS_SCHEMES):
        return None
    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)


def announce(conn: redis.Redis, owner: str, loaded: Iterable[tuple[str, str]], ttl_s: float) -> None:
    """Record that process `owner` has these (stage, spec) loaded, for `ttl_s`; drop lapsed owners."""
    now = time.time()
    entry = {"until": now + ttl_s, "models": [list(m) for m in loaded]}
    stale = [field for field, raw in _entries(conn) if _until(raw) < now]
    pipe = conn.pipeline()
    pipe.hset(KEY, owner, json.dumps(entry))
    if stale:
        pipe.hdel(KEY, *stale)
    pipe.expire(KEY, math.ceil(ttl_s))  # every process gone: the hash goes too
    pipe.execute()


def withdraw(conn: redis.Redis, owner: str) -> None:
    conn.hdel(KEY, owner)


def warm(conn: redis.Redis) -> Counter[tuple[str, str]]:
    """(stage, spec) -> how many live worker processes have it loaded."""
    now, counts = time.time(), Counter[tuple[str, str]]()
    for _, raw in _entries(conn):
        entry = _parse(raw)
        if entry.get("until", 0) >= now:
            counts.update({(str(stage), str(spec)) for stage, spec in entry.get("models", [])})
    return counts


def _entries(conn: redis.Redis) -> list[tuple[str, bytes]]:
    raw: dict[Any, Any] = conn.hgetall(KEY)  # type: ignore[assignment]  # sync client: a dict
    return [(k.decode() if isinstance(k, bytes) else str(k), v) for k, v in raw.items()]


def _parse(raw: bytes | str) -> dict[str, Any]:
    try:
        entry = json.loads(raw)
    except ValueError:
        return {}
    return entry if isinstance(entry, dict) else {}


def _until(raw: bytes | str) -> float:
    return float(_parse(raw).get("until", 0))
