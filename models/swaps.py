"""Hot swaps: a model id pointed at other weights at run time, in one Redis hash that web and workers read.

`genqueue models swap text tagged /models/tagged-v2` writes `text:tagged` -> the new spec. Each
process reads the hash at most once a second (Swaps.effective) and applies it over its settings
as `model_swaps`, so the catalog, the cache key and the worker's choice of weights all follow:
the web keys new jobs by the new version, and a worker's next stage attempt loads the new weights
(tasks.model_swaps: beside the old, which are then unloaded). An attempt that has started keeps
the weights it started with, so a job records exactly one version per stage.
"""

from __future__ import annotations

import threading
import time

import redis

from models import presence
from models.catalog import parse_extra_models
from models.settings import Settings

KEY = "genqueue:models:swaps"
READ_EVERY_S = 1.0


def swap(conn: redis.Redis, stage: str, model_id: str, spec: str) -> None:
    parse_extra_models(f"{stage}:{model_id}={spec}")  # ValueError for a malformed one
    conn.hset(KEY, f"{stage}:{model_id}", spec)


def unswap(conn: redis.Redis, stage: str, model_id: str) -> bool:
    return bool(conn.hdel(KEY, f"{stage}:{model_id}"))


def read(conn: redis.Redis) -> str:
    """The swaps as `model_swaps` entries, in a stable order."""
    raw: dict[bytes, bytes] = conn.hgetall(KEY)  # type: ignore[assignment]  # sync client: a dict
    return ",".join(f"{k.decode()}={v.decode()}" for k, v in sorted(raw.items()))


class Swaps:
    """This process's view of the swaps, re-read at most every READ_EVERY_S (one HGETALL)."""

    def __init__(self, url: str) -> None:
        self.conn = presence.client(url)
        self._lock = threading.Lock()
        self._read_at, self._entries = -READ_EVERY_S, ""

    def entries(self) -> str:
        if self.conn is None:  # no shared Redis (one embedded process): the settings' swaps only
            return ""
        with self._lock:
            if time.monotonic() - self._read_at >= READ_EVERY_S:
                try:
                    self._entries = read(self.conn)
                except redis.RedisError:
                    pass  # Redis away: keep the last swaps seen (the settings' own, at first)
                self._read_at = time.monotonic()
            return self._entries

    def effective(self, settings: Settings) -> Settings:
        """`settings` with the swaps in effect on top of its own model_swaps."""
        live = self.entries()
        if not live:
            return settings
        merged = ",".join(e for e in (settings.model_swaps, live) if e)  # the later entry wins
        return settings.model_copy(update={"model_swaps": merged})
