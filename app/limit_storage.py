"""Rate-limit counters in Redis in one round trip per limit: limits' RedisStorage, whose sliding-
window acquire also returns the window it left, which the RateLimit headers then read."""

from __future__ import annotations

import threading
import time
from typing import Any

from limits.storage import RedisStorage

SCHEME = "genqueue+"  # prefixed to a redis:// or rediss:// URI, which the storage then uses as is

# limits' acquire_sliding_window.lua, ending with the window's state (what sliding_window.lua
# would read right after) instead of a bare yes/no: {acquired, previous count, previous TTL,
# current count, current TTL}, TTLs in ms.
_ACQUIRE_AND_READ = b"""
local limit = tonumber(ARGV[1])
local expiry = tonumber(ARGV[2]) * 1000
local amount = tonumber(ARGV[3])

local current_ttl = tonumber(redis.call('pttl', KEYS[2]))
if current_ttl > 0 and current_ttl < expiry then
    redis.call('rename', KEYS[2], KEYS[1])
    redis.call('set', KEYS[2], 0, 'PX', current_ttl + expiry)
end

local previous_count = tonumber(redis.call('get', KEYS[1])) or 0
local previous_ttl = tonumber(redis.call('pttl', KEYS[1])) or 0
local current_count = tonumber(redis.call('get', KEYS[2])) or 0
current_ttl = tonumber(redis.call('pttl', KEYS[2])) or 0
if previous_ttl <= 0 then previous_ttl = 0 end
if current_ttl <= 0 then current_ttl = 0 end

local weighted_count = math.floor(previous_count * previous_ttl / expiry) + current_count
if amount > limit or (weighted_count + amount) > limit then
    return {0, previous_count, previous_ttl, current_count, current_ttl}
end
if redis.call('exists', KEYS[2]) == 1 then
    redis.call('incrby', KEYS[2], amount)
else
    redis.call('set', KEYS[2], amount, 'PX', expiry * 2)
    current_ttl = expiry * 2
end
return {1, previous_count, previous_ttl, current_count + amount, current_ttl}
"""

# A window read this long after its acquire, on the same thread (greenlet), is served from it.
# It is the same request's header (app.limits); anything later reads Redis as usual.
FRESH_S = 0.5

Window = tuple[int, float, int, float]  # previous count, its seconds left, current count, seconds left


def _seconds(ms: Any) -> float:
    return max(0.0, float(ms or 0)) / 1000


class WindowMemoRedisStorage(RedisStorage):
    """`genqueue+redis://...`: RedisStorage whose acquire remembers the window it leaves."""

    STORAGE_SCHEME = [SCHEME + "redis", SCHEME + "rediss"]

    def __init__(self, uri: str, **options: Any) -> None:
        self._memo = threading.local()  # gevent patches it per greenlet, as it does threads
        super().__init__(uri.removeprefix(SCHEME), **options)

    def initialize_storage(self, uri: str) -> None:
        super().initialize_storage(uri)
        self._acquire_and_read = self.get_connection().register_script(_ACQUIRE_AND_READ)

    def _windows(self) -> dict[str, tuple[float, Window]]:
        windows: dict[str, tuple[float, Window]] | None = getattr(self._memo, "windows", None)
        if windows is None:
            windows = self._memo.windows = {}
        return windows

    def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        previous_key = self.prefixed_key(self._previous_window_key(key))
        current_key = self.prefixed_key(self._current_window_key(key))
        acquired, prev, prev_ttl, cur, cur_ttl = self._acquire_and_read(
            [previous_key, current_key], [limit, expiry, amount]
        )
        window = (int(prev or 0), _seconds(prev_ttl), int(cur or 0), _seconds(cur_ttl))
        self._windows()[key] = (time.monotonic(), window)
        return bool(acquired)

    def get_sliding_window(self, key: str, expiry: int) -> Window:
        remembered = self._windows().pop(key, None)
        if remembered is not None and time.monotonic() - remembered[0] < FRESH_S:
            return remembered[1]
        return super().get_sliding_window(key, expiry)
