"""One redis-py client per kombu Redis channel, instead of a new one for every command.

kombu 5.7's Redis channel runs each of its commands (a message's LPUSH, the QoS bookkeeping of
every delivery and ack) through `conn_or_acquire()`, which builds a new `redis.Redis` on the
channel's connection pool each time. Building one copies redis-py's table of response callbacks:
5% of a pipeline worker's CPU samples (py-spy, `python -m bench.pipeline`) and a share of every
API publish went there, for an object that holds nothing but the pool. A redis-py client is safe
to share between threads (connections are taken from the pool per command), so the channel keeps
the one it built, and builds another only when its pool is replaced (a reconnect).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_PATCHED = "_genqueue_client_per_channel"
_CLIENT = "_genqueue_client"


def install() -> bool:
    """Patch kombu's Redis Channel once per process; False if kombu's Redis transport is missing."""
    try:
        from kombu.transport import redis as kombu_redis
    except ImportError:  # no Redis transport in this install: nothing to patch
        return False
    channel_cls: Any = kombu_redis.Channel
    if getattr(channel_cls.conn_or_acquire, _PATCHED, False):
        return True
    original = channel_cls.conn_or_acquire

    @functools.wraps(original)
    @contextmanager
    def conn_or_acquire(self: Any, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        kept = self.__dict__.get(_CLIENT)
        if kept is None or kept.connection_pool is not self.pool:
            kept = self.__dict__[_CLIENT] = self._create_client()
        yield kept

    setattr(conn_or_acquire, _PATCHED, True)
    channel_cls.conn_or_acquire = conn_or_acquire
    return True


def uninstall() -> None:
    """Undo install() (the benchmark's and the tests' baseline)."""
    from kombu.transport import redis as kombu_redis

    channel_cls: Any = kombu_redis.Channel
    current = channel_cls.conn_or_acquire
    if getattr(current, _PATCHED, False):
        channel_cls.conn_or_acquire = current.__wrapped__
