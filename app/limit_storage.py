"""All of a plan's rate limits checked and counted in one Redis round trip (sliding window counters).

limits' RedisStorage keeps two counters per limit (the current and the previous window) and
checks one limit per script call; a plan has several ("100/second;3000/minute"), so a request
paid one round trip each. This script is limits' acquire_sliding_window.lua run over every
limit of the request at once: all of them are checked first and counted only if none is
breached (a refused request uses up no budget), and each limit's window is returned as it is
left and kept for the RateLimit headers, which then need no second read (limits' strategy reads
them through get_sliding_window). The keys are limits' own, under its prefix.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from limits import RateLimitItem
from limits.storage import RedisStorage

# KEYS: previous, current window key per limit. ARGV: amount, then limit and expiry (s) per limit.
# Returns {acquired, then per limit: previous count, previous TTL, current count, current TTL}
# (TTLs in ms), the windows after the hit when acquired, as found when not.
_ACQUIRE_ALL = b"""
local amount = tonumber(ARGV[1])
local n = #KEYS / 2
local found = {}
local ok = 1
for i = 1, n do
    local previous_key, current_key = KEYS[2 * i - 1], KEYS[2 * i]
    local limit = tonumber(ARGV[2 * i])
    local expiry = tonumber(ARGV[2 * i + 1]) * 1000
    local current_ttl = tonumber(redis.call('pttl', current_key))
    if current_ttl > 0 and current_ttl < expiry then
        redis.call('rename', current_key, previous_key)
        redis.call('set', current_key, 0, 'PX', current_ttl + expiry)
    end
    local previous_count = tonumber(redis.call('get', previous_key)) or 0
    local previous_ttl = tonumber(redis.call('pttl', previous_key)) or 0
    local current_count = tonumber(redis.call('get', current_key)) or 0
    current_ttl = tonumber(redis.call('pttl', current_key)) or 0
    if previous_ttl <= 0 then previous_ttl = 0 end
    if current_ttl <= 0 then current_ttl = 0 end
    local weighted = math.floor(previous_count * previous_ttl / expiry) + current_count
    if amount > limit or weighted + amount > limit then ok = 0 end
    found[i] = {previous_count, previous_ttl, current_count, current_ttl}
end
local out = {ok}
for i = 1, n do
    local w = found[i]
    if ok == 1 then
        local current_key = KEYS[2 * i]
        if redis.call('exists', current_key) == 1 then
            redis.call('incrby', current_key, amount)
        else
            local expiry = tonumber(ARGV[2 * i + 1]) * 1000
            redis.call('set', current_key, amount, 'PX', expiry * 2)
            w[4] = expiry * 2
        end
        w[3] = w[3] + amount
    end
    for j = 1, 4 do out[#out + 1] = w[j] end
end
return out
"""

# previous count, its seconds left, current count, its seconds left: get_sliding_window's shape
Window = tuple[int, float, int, float]

SCHEME = "genqueue+"  # prefixed to a redis:// or rediss:// URI, which the storage then uses as is

# A window read this long after its acquire, on the same thread (greenlet), is served from it.
# It is the same request's header (app.limits); anything later reads Redis as usual.
FRESH_S = 0.5


def _seconds(ms: Any) -> float:
    return max(0.0, float(ms or 0)) / 1000


class PlanWindowsRedisStorage(RedisStorage):
    """`genqueue+redis://...`: limits' RedisStorage that checks and counts a request against
    several limits in one script call, and remembers the windows it left for the headers."""

    STORAGE_SCHEME = [SCHEME + "redis", SCHEME + "rediss"]

    def __init__(self, uri: str, **options: Any) -> None:
        self._memo = threading.local()  # gevent patches it per greenlet, as it does threads
        super().__init__(uri.removeprefix(SCHEME), **options)

    def initialize_storage(self, uri: str) -> None:
        super().initialize_storage(uri)
        self._acquire_all = self.get_connection().register_script(_ACQUIRE_ALL)

    def _windows(self) -> dict[str, tuple[float, Window]]:
        windows: dict[str, tuple[float, Window]] | None = getattr(self._memo, "windows", None)
        if windows is None:
            windows = self._memo.windows = {}
        return windows

    def acquire_all(
        self, items: Sequence[RateLimitItem], identifiers: Sequence[str], amount: int = 1
    ) -> bool:
        """Count a request against every limit, or against none if any would be breached."""
        names = [item.key_for(*identifiers) for item in items]
        keys: list[str] = []
        args: list[int] = [amount]
        for name, item in zip(names, items, strict=True):
            # limits' own names for a limit's two windows (one cluster slot), under its prefix
            keys += [
                self.prefixed_key(self._previous_window_key(name)),
                self.prefixed_key(self._current_window_key(name)),
            ]
            args += [item.amount, item.get_expiry()]
        reply = self._acquire_all(keys, args)
        now, memo = time.monotonic(), self._windows()
        for i, name in enumerate(names):
            prev, prev_ttl, cur, cur_ttl = reply[1 + 4 * i : 5 + 4 * i]
            memo[name] = (now, (int(prev or 0), _seconds(prev_ttl), int(cur or 0), _seconds(cur_ttl)))
        return bool(reply[0])

    def get_sliding_window(self, key: str, expiry: int) -> Window:
        remembered = self._windows().pop(key, None)
        if remembered is not None and time.monotonic() - remembered[0] < FRESH_S:
            return remembered[1]
        return super().get_sliding_window(key, expiry)
